"""Health endpoints for Django: a plain JSON view and a django-health-check (4.x) check.

Both probe every cache alias whose ``BACKEND`` is ``sentinel_cache.django.ShardedSentinelCache``
with :func:`sentinel_cache.core.admin.health.check` (aliases with equal settings share one core and
are probed once): a key written and read back on every shard's current master, all shards at
once, within a short budget; a shard that fails is named.

The view, for probes that do not go through django-health-check::

    from sentinel_cache.django.health import health_view

    urlpatterns = [path("health/cache/", health_view, name="cache-health")]

It answers JSON with HTTP 200 when every shard of every cache can serve (status ``"ok"`` or
``"degraded"``) and 503 when one cannot (``"down"``); ``?fail_on=degraded`` makes degraded a 503
too (for alerting; a readiness probe keeps the default, so it does not fail during a planned
failover). ``?deep=1`` adds the sentinels' view (slower: every sentinel asked). Keyword arguments
in the URLconf set the defaults: ``path(..., health_view, {"timeout": 0.3, "fail_on": "down"})``;
``aliases`` limits the check to some aliases.

The django-health-check check, for ``HealthCheckView``::

    from health_check.views import HealthCheckView

    path("ht/", HealthCheckView.as_view(checks=[
        "health_check.checks.Database",
        "sentinel_cache.django.health.SentinelCacheHealthCheck",
    ]))

It raises ``ServiceUnavailable`` naming every failing shard when a cache cannot serve, and
(with ``fail_on="degraded"``) ``ServiceWarning`` listing what reduces redundancy. django-health-
check 4.x is supported (its checks are classes listed in the view; 3.x registered plugins from
an app config, which this module does not provide).
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Iterable
from typing import Any

from django.core.cache import caches
from django.http import HttpRequest, JsonResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_safe

from sentinel_cache.core.admin import health as core_health
from sentinel_cache.core.admin.health import DEFAULT_TIMEOUT, HealthReport
from sentinel_cache.core.admin.states import HEALTH_FAIL_ON
from sentinel_cache.core.topology.sharded_pool import ShardedSentinelPool
from sentinel_cache.django.checks import sentinel_aliases

__all__ = ["SentinelCacheHealthCheck", "check_caches", "health_view"]


def _cores(
    aliases: Iterable[str] | None,
) -> tuple[list[tuple[str, ShardedSentinelPool | str]], dict[str, Any]]:
    """Each selected alias with its core, or the error that kept it from being built."""
    configured = sentinel_aliases()
    names = list(configured) if aliases is None else list(aliases)
    cores: list[tuple[str, ShardedSentinelPool | str]] = []
    prefixes: dict[str, Any] = {}
    for alias in names:
        if alias not in configured:
            cores.append((alias, "not a cache alias of sentinel_cache.django.ShardedSentinelCache"))
            continue
        try:
            cache = caches[alias]
            cores.append((alias, cache.core))  # type: ignore[attr-defined]
            prefixes[alias] = cache.key_prefix
        except Exception as exc:  # ImproperlyConfigured: the system checks name the field
            cores.append((alias, f"the cache could not be built: {type(exc).__name__}: {exc}"))
    return cores, prefixes


def check_caches(
    aliases: Iterable[str] | None = None, *, timeout: float | None = None, deep: bool = False
) -> dict[str, HealthReport | str]:
    """:func:`~sentinel_cache.core.admin.health.check` for every alias of our backend (or the
    ``aliases`` given), all at once: alias -> report, or the error that kept it unchecked."""
    cores, _ = _cores(aliases)
    return core_health.check_all(cores, timeout=timeout, deep=deep)


@never_cache
@require_safe
def health_view(
    request: HttpRequest,
    *,
    timeout: float | None = None,
    fail_on: str = HEALTH_FAIL_ON,
    deep: bool = False,
    aliases: Iterable[str] | None = None,
) -> JsonResponse:
    """JSON health of every sentinel_cache alias: 200 when every shard can serve, else 503.

    Query parameters: ``fail_on=degraded`` (503 when redundancy is reduced too), ``deep=1``
    (add the sentinels' view). URLconf keyword arguments set ``timeout`` (seconds; default
    0.5 or the pool's ``SOCKET_TIMEOUT`` if shorter), ``fail_on``, ``deep`` and ``aliases``.
    """
    try:
        policy = core_health.parse_fail_on(request.GET.get("fail_on"), fail_on)
    except ValueError as exc:
        return JsonResponse({"error": str(exc)}, status=400)
    deep = deep or core_health.parse_flag(request.GET.get("deep"))
    cores, prefixes = _cores(aliases)
    reports = core_health.check_all(cores, timeout=timeout, deep=deep)
    code, body = core_health.summary(reports, fail_on=policy, key_prefixes=prefixes)
    return JsonResponse(body, status=code)


try:
    from health_check.base import HealthCheck
    from health_check.exceptions import ServiceUnavailable, ServiceWarning
except ImportError:  # django-health-check is optional (and 3.x has no health_check.base)
    HealthCheck = None


if HealthCheck is not None:

    @dataclasses.dataclass
    class SentinelCacheHealthCheck(HealthCheck):
        """django-health-check 4.x: every shard of every sentinel_cache alias (or ``alias``)
        can serve; the error names each failing shard.

        ``timeout`` is the probe's budget (django-health-check gives up a second after it);
        ``fail_on="degraded"`` reports reduced redundancy as a ``ServiceWarning``, which
        django-health-check counts as a failure (with the default, ``"down"``, a degraded cache
        passes, so a readiness probe on the view does not fail during a planned failover);
        ``deep`` adds the sentinels' view.
        """

        alias: str | None = None
        timeout: datetime.timedelta = dataclasses.field(
            default=datetime.timedelta(seconds=DEFAULT_TIMEOUT), repr=False
        )
        fail_on: str = dataclasses.field(default=HEALTH_FAIL_ON, repr=False)
        deep: bool = dataclasses.field(default=False, repr=False)

        def __post_init__(self) -> None:
            core_health.parse_fail_on(self.fail_on)  # ValueError now, not at the first probe

        def run(self) -> None:
            aliases = None if self.alias is None else [self.alias]
            reports = check_caches(aliases, timeout=self.timeout.total_seconds(), deep=self.deep)
            _, body = core_health.summary(reports, fail_on=self.fail_on)
            if not body["ready"]:
                raise ServiceUnavailable("; ".join(body["problems"]))
            if body["degraded"] and self.fail_on == core_health.DEGRADED:
                raise ServiceWarning("; ".join(body["warnings"]))

else:

    def __getattr__(name: str) -> Any:
        if name == "SentinelCacheHealthCheck":
            raise ImportError(
                "sentinel_cache.django.health.SentinelCacheHealthCheck needs django-health-check "
                '4.x: pip install "django-health-check>=4"'
            )
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
