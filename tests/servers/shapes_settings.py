"""Settings of the tiny Django app the server-shape tests serve (gunicorn, uvicorn).

The topology comes from the environment (the test starts the servers with it), so the same
module serves any local cluster: ``SHAPES_SENTINELS`` (``h:p,h:p``), ``SHAPES_MASTERS``
(``a,b``), ``SHAPES_IGNORE_EXCEPTIONS`` (``1``: fail open, anything else: raise) and
``SHAPES_OUTAGE_HOLD`` (seconds; unset: the default's).
"""

from __future__ import annotations

import os

SECRET_KEY = "server-shapes-tests-only"
DEBUG = False
ALLOWED_HOSTS = ["127.0.0.1", "localhost"]
INSTALLED_APPS = ["sentinel_cache"]
MIDDLEWARE: list[str] = []
ROOT_URLCONF = "shapes_views"
DATABASES: dict[str, dict[str, str]] = {}
USE_TZ = True

CACHES = {
    "default": {
        "BACKEND": "sentinel_cache.django.ShardedSentinelCache",
        "LOCATION": os.environ.get("SHAPES_SENTINELS", "127.0.0.1:26379").split(","),
        "KEY_PREFIX": "shapes",
        "OPTIONS": {
            "MASTERS": os.environ.get("SHAPES_MASTERS", "shard0,shard1").split(","),
            "IGNORE_EXCEPTIONS": os.environ.get("SHAPES_IGNORE_EXCEPTIONS") == "1",
            # A cache fails fast: a dead master must not hold a worker for the 5 s default.
            "SOCKET_TIMEOUT": 1.0,
            **(
                {"OUTAGE_HOLD": float(os.environ["SHAPES_OUTAGE_HOLD"])}
                if os.environ.get("SHAPES_OUTAGE_HOLD")
                else {}
            ),
            # Unset: the default (the shared asyncio connection); "0" turns it off (the pool).
            **(
                {"ASYNC_MULTIPLEX": os.environ["SHAPES_ASYNC_MULTIPLEX"] == "1"}
                if os.environ.get("SHAPES_ASYNC_MULTIPLEX")
                else {}
            ),
        },
    }
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {"sentinel_cache": {"handlers": ["console"], "level": "WARNING"}},
}
