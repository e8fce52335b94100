"""ASGI entry point (``uvicorn shapes_asgi:application``); uses the cache at import time too,
so a worker's core is started by sync code and then used by async views."""

from __future__ import annotations

import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "shapes_settings")

from django.core.asgi import get_asgi_application  # noqa: E402

application = get_asgi_application()

from shapes_views import touch_at_import  # noqa: E402

touch_at_import()
