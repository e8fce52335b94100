"""The minimal Django settings the test directories without a settings module of their own
share (django_ops, health, reshard): configured by whichever of them is imported first."""

from __future__ import annotations

import django
from django.apps import apps
from django.conf import settings

LOCMEM = {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}


def configure_django() -> None:
    """Configure the minimal settings unless already done; a no-op the second time."""
    if not settings.configured:
        settings.configure(
            DEBUG=False,
            SECRET_KEY="sentinel-cache-tests-not-secret-" + "x" * 40,
            INSTALLED_APPS=[
                "django.contrib.contenttypes",
                "django.contrib.auth",
                "sentinel_cache",
            ],
            DATABASES={"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}},
            CACHES={"default": dict(LOCMEM)},
            USE_TZ=True,
            DEFAULT_AUTO_FIELD="django.db.models.AutoField",
        )
    if not apps.ready:
        django.setup()
