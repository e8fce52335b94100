"""WSGI entry point: ``gunicorn example_project.wsgi`` (with the SENTINEL_CACHE_* variables)."""

from __future__ import annotations

import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "example_project.settings")

application = get_wsgi_application()
