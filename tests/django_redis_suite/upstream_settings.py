"""django-redis's ``tests/settings/sqlite.py``, translated as docs/migration.md tells a team.

Not collected by pytest: ``test_django_redis_suite.py`` copies it as
``tests/settings/sentinel_cache.py`` for django-redis's own suite. Each alias of upstream's file
keeps its name and role: ``BACKEND`` is ours, ``LOCATION`` the sentinels, ``MASTERS`` the two
shards (``CLIENT_CLASS`` is not needed), ``DB`` a database of the suite's own;
``doesnotexist`` points at a port where no sentinel listens (upstream's: a port where no
server listens), ``with_prefix`` has upstream's ``KEY_PREFIX``. The topology arrives in
environment variables.
"""

from __future__ import annotations

import os
from typing import Any

SECRET_KEY = "django_tests_secret_key"

_BACKEND = "sentinel_cache.django.ShardedSentinelCache"
_SENTINELS = os.environ["SENTINEL_CACHE_TEST_SENTINELS"].split(",")


def _options() -> dict[str, Any]:
    options: dict[str, Any] = {
        "MASTERS": os.environ["SENTINEL_CACHE_TEST_MASTERS"].split(","),
        "DB": int(os.environ["SENTINEL_CACHE_TEST_DB"]),
    }
    if os.environ.get("SENTINEL_CACHE_TEST_PASSWORD"):
        options["PASSWORD"] = os.environ["SENTINEL_CACHE_TEST_PASSWORD"]
    if os.environ.get("SENTINEL_CACHE_TEST_SENTINEL_PASSWORD"):
        options["SENTINEL_PASSWORD"] = os.environ["SENTINEL_CACHE_TEST_SENTINEL_PASSWORD"]
    return options


CACHES = {
    "default": {"BACKEND": _BACKEND, "LOCATION": _SENTINELS, "OPTIONS": _options()},
    "doesnotexist": {
        "BACKEND": _BACKEND,
        "LOCATION": [os.environ["SENTINEL_CACHE_TEST_DEAD_SENTINEL"]],
        "OPTIONS": _options(),
    },
    "sample": {"BACKEND": _BACKEND, "LOCATION": _SENTINELS, "OPTIONS": _options()},
    "with_prefix": {
        "BACKEND": _BACKEND,
        "LOCATION": _SENTINELS,
        "OPTIONS": _options(),
        "KEY_PREFIX": "test-prefix",
    },
}

INSTALLED_APPS = [
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
]

USE_TZ = False
