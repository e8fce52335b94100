"""Django app config: put ``"sentinel_cache"`` in ``INSTALLED_APPS`` to get the system checks
and the ``sentinel_status`` management command (the cache backend itself works without it)."""

from __future__ import annotations

from django.apps import AppConfig


class SentinelCacheConfig(AppConfig):
    name = "sentinel_cache"
    label = "sentinel_cache"
    verbose_name = "Sharded Sentinel cache"

    def ready(self) -> None:
        from sentinel_cache.django import checks

        checks.register()
