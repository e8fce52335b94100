"""Settings of the full-stack app: the cache is the contender the environment names
(:func:`benchmarks.fullstack_app.caches.from_environment`); nothing else (no database, no
middleware), so a request costs Django's routing plus the view's cache work."""

from __future__ import annotations

from benchmarks.fullstack_app.caches import from_environment

SECRET_KEY = "fullstack-benchmark-only"
DEBUG = False
ALLOWED_HOSTS = ["127.0.0.1", "localhost", "testserver"]
INSTALLED_APPS: list[str] = []
MIDDLEWARE: list[str] = []
ROOT_URLCONF = "benchmarks.fullstack_app.views"
DATABASES: dict[str, dict[str, str]] = {}
USE_TZ = True
CACHES = {"default": from_environment()}
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "root": {"handlers": ["console"], "level": "WARNING"},
}
