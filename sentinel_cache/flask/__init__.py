"""Flask-Caching adapter: ``CACHE_TYPE = "sentinel_cache.flask.ShardedSentinelCache"``.

``cache`` holds the backend, ``caching`` the ``Cache`` whose ``@cached``/``@memoize`` compute a
missing value once, ``settings`` translates Flask settings into the core's options and
``commands`` the ``flask sentinel-status`` and ``flask sentinel-reshard`` commands.
"""

from __future__ import annotations

try:
    import flask  # noqa: F401
    import flask_caching  # noqa: F401
except ImportError as exc:  # the optional dependency is missing: say which extra brings it
    raise ModuleNotFoundError(
        "sentinel_cache.flask needs Flask-Caching (with Flask), which could not be imported "
        f'({exc}); install the extra: pip install "sentinel-cache[flask]"',
        name=exc.name,
    ) from exc

from sentinel_cache.flask.cache import ShardedSentinelCache
from sentinel_cache.flask.caching import Cache
from sentinel_cache.flask.commands import (
    CACHE_TYPE,
    COMMAND_NAME,
    init_app,
    sentinel_reshard_command,
    sentinel_status_command,
)

__all__ = [
    "CACHE_TYPE",
    "Cache",
    "COMMAND_NAME",
    "ShardedSentinelCache",
    "init_app",
    "sentinel_reshard_command",
    "sentinel_status_command",
]
