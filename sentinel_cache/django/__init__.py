"""Django adapter: ``"BACKEND": "sentinel_cache.django.ShardedSentinelCache"``.

``cache`` holds the backend and ``checks`` the system checks; the ``sentinel_status`` command and
the app config live at the package root, where Django looks for them
(``INSTALLED_APPS = ["sentinel_cache"]``).
"""

from __future__ import annotations

from sentinel_cache.django.cache import ShardedSentinelCache

__all__ = ["ShardedSentinelCache"]
