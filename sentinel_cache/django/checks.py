"""Django system checks for caches that use :class:`sentinel_cache.django.ShardedSentinelCache`.

A typo in ``OPTIONS`` should fail ``manage.py check`` (and so CI and deploys), not the first
request. The plain checks only build the backend object (which parses its settings with the core
parser and connects nowhere); the network is touched only by ``check --deploy``, with short
timeouts, every sentinel asked at once.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Mapping, Sequence
from typing import Any

from django.apps import AppConfig
from django.conf import settings
from django.core import checks
from django.core.exceptions import ImproperlyConfigured
from django.utils.module_loading import import_string

from sentinel_cache.core.config import PoolConfig
from sentinel_cache.core.status import probe_sentinels, run_all
from sentinel_cache.exceptions import ConfigurationError

BACKEND = "sentinel_cache.django.ShardedSentinelCache"
TAG = "sentinel_cache"
MIN_SENTINELS = 3
# check --deploy may run in a build container or a CI job: say "unreachable" quickly, never hang.
DEPLOY_PING_TIMEOUT = 0.5


def sentinel_aliases() -> dict[str, Mapping[str, Any]]:
    """Every alias in ``settings.CACHES`` whose BACKEND is this library's Django backend."""
    caches: Mapping[str, Any] = getattr(settings, "CACHES", {}) or {}
    return {
        alias: entry
        for alias, entry in caches.items()
        if isinstance(entry, Mapping) and entry.get("BACKEND") == BACKEND
    }


def pool_config(entry: Mapping[str, Any]) -> PoolConfig:
    """The alias's pool configuration, exactly as the backend reads it (nothing connects).

    Built the way Django's cache handler builds a backend, so the check can never disagree with
    the backend about what is valid (options it filters, serializers it resolves, ...).
    """
    params = dict(entry)
    backend = import_string(params.pop("BACKEND"))
    location = params.pop("LOCATION", "")
    config: PoolConfig = backend(location, params).pool_config
    return config


def check_configuration(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    """E001 for every sentinel cache whose LOCATION/OPTIONS do not parse."""
    errors: list[checks.CheckMessage] = []
    for alias, entry in sentinel_aliases().items():
        try:
            pool_config(entry)
        except Exception as exc:  # a check reports; it must never crash `manage.py check`
            # The backend's ImproperlyConfigured carries the parser's message, naming the field.
            known = isinstance(exc, (ImproperlyConfigured, ConfigurationError))
            message = str(exc) if known else f"{type(exc).__name__}: {exc}"
            errors.append(
                checks.Error(
                    message,
                    hint=f"Fix LOCATION/OPTIONS of CACHES[{alias!r}].",
                    obj=alias,
                    id="sentinel_cache.E001",
                )
            )
    return errors


def check_deployment(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    """W001 for fewer than three sentinels, W002 for sentinels that do not answer a PING."""
    configs: dict[str, PoolConfig] = {}
    for alias, entry in sentinel_aliases().items():
        try:
            configs[alias] = pool_config(entry)
        except Exception:  # already reported as E001 by check_configuration
            continue
    warnings: list[checks.CheckMessage] = []
    for alias, config in configs.items():
        count = len(config.sentinels)
        if count < MIN_SENTINELS:
            warnings.append(
                checks.Warning(
                    f"only {count} sentinel{'s' if count != 1 else ''} "
                    f"configured; with fewer than {MIN_SENTINELS} the loss of one machine can "
                    f"leave no majority to agree on a failover.",
                    hint="Run at least three sentinels on independent machines and list them all.",
                    obj=alias,
                    id="sentinel_cache.W001",
                )
            )
    # Every sentinel of every alias at once: a black-holed one costs one short timeout.
    tasks = {
        alias: functools.partial(
            probe_sentinels,
            config.sentinels,
            config.sentinel_options(),
            timeout=DEPLOY_PING_TIMEOUT,
        )
        for alias, config in configs.items()
    }
    outcomes = run_all(tasks, time.monotonic() + 3 * DEPLOY_PING_TIMEOUT + 0.5, "deploy check")
    for alias, config in configs.items():
        outcome = outcomes[alias]
        if isinstance(outcome, BaseException):  # past the deadline: no answer from any of them
            failed = [f"{a} ({type(outcome).__name__}: {outcome})" for a in config.sentinels]
        else:
            failed = [f"{p.address} ({p.error})" for p in outcome if not p.reachable]
        if failed:
            warnings.append(
                checks.Warning(
                    f"{len(failed)} of {len(config.sentinels)} sentinels "
                    f"unreachable: {'; '.join(failed)}",
                    hint=(
                        "Check the addresses, firewalls and SENTINEL_* credentials; "
                        "`manage.py sentinel_status` shows the whole topology."
                    ),
                    obj=alias,
                    id="sentinel_cache.W002",
                )
            )
    return warnings


def register() -> None:
    """Called by the app config's ready(); registering twice is harmless (a set)."""
    checks.register(check_configuration, checks.Tags.caches, TAG)
    checks.register(check_deployment, checks.Tags.caches, TAG, deploy=True)
