"""ASGI entry point: ``uvicorn benchmarks.fullstack_app.asgi:application`` (view ``/amix``)."""

from __future__ import annotations

import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "benchmarks.fullstack_app.settings")
os.environ.setdefault("FULLSTACK_API", "asgi")

from django.core.asgi import get_asgi_application  # noqa: E402

application = get_asgi_application()
