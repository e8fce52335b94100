"""Django adapter: ``"BACKEND": "sentinel_cache.django.ShardedSentinelCache"``.

``cache`` holds the backend, ``pages`` ``cache_page``, ``CacheMiddleware`` and the split
``UpdateCacheMiddleware`` / ``FetchFromCacheMiddleware`` (one view run per missing page), ``checks`` the system checks, ``compat`` the django-redis settings
it translates and ``connection`` django-redis's ``get_redis_connection``; the ``sentinel_status`` command and
the app config live at the package root, where Django looks for them
(``INSTALLED_APPS = ["sentinel_cache"]``).
"""

from __future__ import annotations

try:
    import django  # noqa: F401
except ImportError as exc:  # the optional dependency is missing: say which extra brings it
    raise ModuleNotFoundError(
        f"sentinel_cache.django needs Django, which could not be imported ({exc}); "
        'install the extra: pip install "sentinel-cache[django]"',
        name=exc.name,
    ) from exc

from sentinel_cache.django.cache import InvalidKeyError, ShardedSentinelCache
from sentinel_cache.django.connection import get_redis_connection
from sentinel_cache.django.keys import plain_key
from sentinel_cache.django.pages import (
    CacheMiddleware,
    FetchFromCacheMiddleware,
    UpdateCacheMiddleware,
    cache_page,
)

__all__ = [
    "CacheMiddleware",
    "FetchFromCacheMiddleware",
    "InvalidKeyError",
    "ShardedSentinelCache",
    "UpdateCacheMiddleware",
    "cache_page",
    "get_redis_connection",
    "plain_key",
]
