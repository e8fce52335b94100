"""Django settings for tests/django: pytest (via conftest) and Django's own cache suite.

pytest does not use ``DJANGO_SETTINGS_MODULE``: ``conftest.py`` feeds the upper-case names of
this module to ``settings.configure()`` (unless another test directory configured Django first;
the baseline is the same there). The Django suite runs ``python -m django test`` in a
subprocess with ``DJANGO_SETTINGS_MODULE=settings`` and ``SENTINEL_CACHE_DJANGO_SUITE=1``, which
adds the suite's ``cache`` app; the topology reaches it through environment variables.
"""

from __future__ import annotations

import os

SECRET_KEY = "sentinel-cache-tests-not-secret-" + "x" * 40
DEBUG = False
USE_TZ = True
ALLOWED_HOSTS = ["testserver", "localhost", "127.0.0.1"]
DEFAULT_AUTO_FIELD = "django.db.models.AutoField"
INSTALLED_APPS = ["django.contrib.contenttypes", "django.contrib.auth"]
if os.environ.get("SENTINEL_CACHE_DJANGO_SUITE"):
    INSTALLED_APPS.append("cache")
DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}}
# Tests point caches at a topology with override_settings; nothing connects at start-up.
CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}
MIDDLEWARE: list[str] = []
