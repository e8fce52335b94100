"""WSGI entry point: ``gunicorn benchmarks.fullstack_app.wsgi:application`` (view ``/mix``)."""

from __future__ import annotations

import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "benchmarks.fullstack_app.settings")
os.environ.setdefault("FULLSTACK_API", "wsgi")

from django.core.wsgi import get_wsgi_application  # noqa: E402

application = get_wsgi_application()
