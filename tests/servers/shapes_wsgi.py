"""WSGI entry point (``gunicorn shapes_wsgi:application``); uses the cache at import time."""

from __future__ import annotations

import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "shapes_settings")

from django.core.wsgi import get_wsgi_application  # noqa: E402

application = get_wsgi_application()

from shapes_views import touch_at_import  # noqa: E402

touch_at_import()
