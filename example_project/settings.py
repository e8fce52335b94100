"""Settings of the example project: a user's settings, with the topology from the environment.

The cache is configured exactly as a user would configure it; nothing here is demo-specific
except a few ``EXAMPLE_*`` variables (database path, log level, access log, a fast password
hasher for the demo's throwaway accounts).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from django.core.exceptions import ImproperlyConfigured

from example_project.topology import TopologyNotConfigured, from_env

BASE_DIR = Path(__file__).resolve().parent

SECRET_KEY = os.environ.get(
    "EXAMPLE_SECRET_KEY", "example-project-insecure-key-change-me-" + "k" * 20
)
DEBUG = os.environ.get("EXAMPLE_DEBUG", "") == "1"
ALLOWED_HOSTS = ["127.0.0.1", "localhost", "[::1]", "testserver"]

INSTALLED_APPS = [
    "django.contrib.contenttypes",
    "django.contrib.auth",
    "django.contrib.sessions",
    "sentinel_cache",  # manage.py sentinel_status and the system checks
    "example_project.apps.ExampleConfig",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
]

ROOT_URLCONF = "example_project.urls"
WSGI_APPLICATION = "example_project.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
            ],
        },
    }
]

# Users live in sqlite; sessions live in the sharded cache.
if "EXAMPLE_DATABASE" in os.environ:
    _DATABASE = Path(os.environ["EXAMPLE_DATABASE"])
else:
    _DATABASE = BASE_DIR.parent / ".cache" / "example_project.sqlite3"
    _DATABASE.parent.mkdir(exist_ok=True)
DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": str(_DATABASE)}}
DEFAULT_AUTO_FIELD = "django.db.models.AutoField"
# The demo logs dozens of throwaway accounts in on a throwaway database: with Django's default
# hasher (about 0.5 s of CPU a login) that alone would take longer than the rest of the demo, so
# it sets EXAMPLE_FAST_PASSWORD_HASHER=1 and gets Django's own test-speed hasher. Never for real
# accounts.
if os.environ.get("EXAMPLE_FAST_PASSWORD_HASHER") == "1":
    PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]

KEY_PREFIX = "example"


def cache_settings() -> dict[str, Any]:
    """``CACHES`` for the topology in the environment (see :mod:`example_project.topology`).

    A deployment changes the environment and restarts the processes; the demo calls this again
    to "deploy" in its own process (its resharding step).
    """
    try:
        location, topology_options = from_env()
    except TopologyNotConfigured as exc:
        raise ImproperlyConfigured(str(exc)) from None
    options = {
        **topology_options,  # MASTERS, passwords, PREVIOUS_MASTERS during a resharding
        # Values are signed: a node that is written to by someone else cannot make this
        # process unpickle chosen bytes (see docs/security.md).
        "SIGNING_KEY": SECRET_KEY,
    }
    return {
        "default": {
            "BACKEND": "sentinel_cache.django.ShardedSentinelCache",
            "LOCATION": location,  # the sentinels (a list, or one sentinel:// URL)
            "OPTIONS": {
                **options,
                # Prometheus metrics for every shard, served at /metrics (the [prometheus] extra).
                "METRICS": True,
                # A missing page of sentinel_cache.django.cache_page, or a get_or_set miss, is
                # computed once across every process (docs/stampede.md).
                "STAMPEDE_PROTECTION": True,
                # A master that crashes: reads answered by its replica (OUTAGE_READS) and writes
                # (sessions too) held until the sentinels switch, for at most OUTAGE_HOLD
                # seconds (10): both on by default, so nothing is set here (docs/failover.md).
                # SENTINEL_CACHE_OUTAGE_HOLD overrides the hold (0 fails writes at once).
                **(
                    {"OUTAGE_HOLD": float(os.environ["SENTINEL_CACHE_OUTAGE_HOLD"])}
                    if os.environ.get("SENTINEL_CACHE_OUTAGE_HOLD")
                    else {}
                ),
            },
            "KEY_PREFIX": KEY_PREFIX,
            "TIMEOUT": 300,
        },
        # The same servers and keys with a near cache (docs/near-cache.md): for values read on
        # almost every request and rarely written, like the feature flags of /api/flag/. A hit
        # is served from this process's memory; the servers announce every change of a key.
        "near": {
            "BACKEND": "sentinel_cache.django.ShardedSentinelCache",
            "LOCATION": location,
            "OPTIONS": {
                **options,
                "NEAR_CACHE": True,
                "NEAR_CACHE_MAX_ENTRIES": 1_000,
                # Only the flags are kept, and only their changes are announced to us.
                "NEAR_CACHE_PREFIXES": [f"{KEY_PREFIX}:1:flags:"],
            },
            "KEY_PREFIX": KEY_PREFIX,
            "TIMEOUT": None,
        },
    }


CACHES = cache_settings()

SESSION_ENGINE = "django.contrib.sessions.backends.cache"
SESSION_CACHE_ALIAS = "default"

LOGIN_URL = "/accounts/login/"
LOGIN_REDIRECT_URL = "/account/"
LOGOUT_REDIRECT_URL = "/"

USE_TZ = True
TIME_ZONE = "UTC"

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"brief": {"format": "    [%(name)s] %(message)s"}},
    "handlers": {
        "console": {
            "class": "logging.StreamHandler",
            "formatter": "brief",
            "stream": "ext://sys.stdout",
        }
    },
    "loggers": {
        # Failovers, switches and held writes are reported here.
        "sentinel_cache": {
            "handlers": ["console"],
            "level": os.environ.get("EXAMPLE_LOG_LEVEL", "INFO"),
            "propagate": False,
        },
        # One line per HTTP request from the development server (off in the demo).
        "django.server": {
            "handlers": ["console"],
            "level": "INFO" if os.environ.get("EXAMPLE_ACCESS_LOG", "1") == "1" else "WARNING",
            "propagate": False,
        },
    },
}
