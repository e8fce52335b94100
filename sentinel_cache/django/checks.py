"""Django system checks for caches that use :class:`sentinel_cache.django.ShardedSentinelCache`.

A typo in ``OPTIONS`` should fail ``manage.py check`` (and so CI and deploys), not the first
request. The plain checks only build the backend object (which parses its settings with the core
parser and connects nowhere); the network is touched only by ``check --deploy``, with short
timeouts, every sentinel asked at once about every master (about a second at most): a master
name no sentinel monitors, a refused password, an address of LOCATION that is a Redis data node
and not a sentinel, or no sentinel answering at all fails the deploy; some sentinels not
answering is a warning. The sentinels that answered, and the masters they named, are listed (an
Info), so a passing check shows what it confirmed.
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

from sentinel_cache.core.admin.status import (
    NOT_MONITORED,
    SENTINEL_NOT_SENTINEL,
    SentinelProbe,
    master_view,
    probe_sentinels,
    unlisted_masters,
    unlisted_warning,
)
from sentinel_cache.core.config import PoolConfig
from sentinel_cache.core.fanout import run_all
from sentinel_cache.django.compat import HONOURED_GLOBALS, NO_EFFECT_GLOBALS, log_every_ignored
from sentinel_cache.django.previous import previous_option
from sentinel_cache.exceptions import ConfigurationError

BACKEND = "sentinel_cache.django.ShardedSentinelCache"
TAG = "sentinel_cache"
MIN_SENTINELS = 3
# check --deploy may run in a build container or a CI job: say "unreachable" quickly, never hang.
DEPLOY_PING_TIMEOUT = 0.4  # each connect and each reply
DEPLOY_DEADLINE = 1.0  # the whole network part of the check, every sentinel asked at once


def sentinel_aliases() -> dict[str, Mapping[str, Any]]:
    """Every alias in ``settings.CACHES`` whose BACKEND is this library's Django backend."""
    caches: Mapping[str, Any] = getattr(settings, "CACHES", {}) or {}
    return {
        alias: entry
        for alias, entry in caches.items()
        if isinstance(entry, Mapping) and entry.get("BACKEND") == BACKEND
    }


def build_backend(entry: Mapping[str, Any]) -> Any:
    """The alias's backend, built the way Django's cache handler builds it (nothing connects),
    so the checks can never disagree with the backend about what is valid (options it filters,
    serializers it resolves, django-redis settings it translates, ...)."""
    params = dict(entry)
    backend = import_string(params.pop("BACKEND"))
    location = params.pop("LOCATION", "")
    return backend(location, params)


def pool_config(entry: Mapping[str, Any]) -> PoolConfig:
    """The alias's pool configuration, exactly as the backend reads it (nothing connects)."""
    config: PoolConfig = build_backend(entry).pool_config
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


def check_previous_cache(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    """E004 for a ``PREVIOUS_CACHE`` that names no other entry of ``CACHES``, this one, or a
    sentinel cache adopting from another itself (a loop, or a chain to finish first)."""
    configured: Mapping[str, Any] = getattr(settings, "CACHES", {}) or {}
    errors: list[checks.CheckMessage] = []
    for alias, entry in sentinel_aliases().items():
        value = previous_option(entry.get("OPTIONS") or {})
        if value is None:
            continue
        reason = None
        if not isinstance(value, str) or value not in configured:
            reason = f"names no entry of settings.CACHES (it has: {', '.join(sorted(configured))})"
        elif value == alias:
            reason = "names this cache itself"
        elif previous_option((sentinel_aliases().get(value) or {}).get("OPTIONS") or {}):
            reason = (
                f"names a sentinel cache that adopts from "
                f"{previous_option(configured[value]['OPTIONS'])!r} itself"
            )
        if reason is not None:
            errors.append(
                checks.Error(
                    f"OPTIONS['PREVIOUS_CACHE'] = {value!r} {reason}.",
                    hint="Name the CACHES entry of the cache being replaced, left as it was "
                    "(docs/migration.md).",
                    obj=alias,
                    id="sentinel_cache.E004",
                )
            )
    return errors


#: The value format of the Redis backends a PREVIOUS_CACHE may be: django-redis's serializer
#: (by class name) and Django's RedisCache (pickle; both store integers as plain decimals).
DJANGO_REDIS = "django_redis.cache.RedisCache"
DJANGO_REDIS_CACHE = "django.core.cache.backends.redis.RedisCache"
_DJANGO_REDIS_SERIALIZERS = {
    "pickleserializer": "pickle",
    "jsonserializer": "json",
    "msgpackserializer": "msgpack",
}
_IDENTITY = "identitycompressor"


def previous_value_format(entry: Mapping[str, Any]) -> str | None:
    """The value format of a ``CACHES`` entry, as this library names it with
    ``VALUE_FORMAT: "plain"`` (``"pickle"``, ``"json"``, ``"msgpack"``), ``"compressed"`` for a
    compressed django-redis, None for a backend that is not a Redis one (no key to share)."""
    backend = entry.get("BACKEND")
    if backend == DJANGO_REDIS_CACHE:
        return "pickle"
    if backend != DJANGO_REDIS:
        return None
    options = entry.get("OPTIONS") or {}
    compressor = str(options.get("COMPRESSOR") or _IDENTITY).rsplit(".", 1)[-1].lower()
    if compressor != _IDENTITY:
        return "compressed"
    serializer = str(options.get("SERIALIZER") or "PickleSerializer").rsplit(".", 1)[-1]
    return _DJANGO_REDIS_SERIALIZERS.get(serializer.lower(), serializer)


def check_previous_format(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    """W007 (``check --deploy``): a ``PREVIOUS_CACHE`` that stores the same keys as this cache
    (the same key function, prefix and version) in another value format. During a rolling
    deploy a process still on the old cache then reads this cache's values and fails
    (django-redis: ``UnpicklingError: invalid load key, '\\xfe'``), unless the servers differ."""
    configured: Mapping[str, Any] = getattr(settings, "CACHES", {}) or {}
    messages: list[checks.CheckMessage] = []
    for alias, entry in sentinel_aliases().items():
        previous = previous_option(entry.get("OPTIONS") or {})
        if not isinstance(previous, str) or previous not in configured or previous == alias:
            continue  # E004's
        theirs = previous_value_format(configured[previous])
        if theirs is None:
            continue
        try:
            ours = build_backend(entry)
            old = build_backend(configured[previous])
            options = ours.cache_options
            probe = "profile:42"
            key, old_key = ours.make_key(probe), old.make_key(probe)
        except Exception:  # E001/E004 report what does not build
            continue
        if key != old_key:
            continue  # another prefix or version: the keys cannot collide
        if options.value_format == "plain" and options.serializer == theirs:
            continue
        ours_format = f"{options.value_format} {options.serializer}"
        messages.append(
            checks.Warning(
                f"PREVIOUS_CACHE {previous!r} stores the same keys as this cache (both store "
                f"{probe!r} as {key!r}) in another value format ({theirs}; this cache: "
                f"VALUE_FORMAT {ours_format}): during a rolling deploy, a process still on "
                f"{previous!r} that reads a key this cache wrote fails to decode it "
                "(django-redis: UnpicklingError: invalid load key, '\\xfe').",
                hint="Give this cache another KEY_PREFIX or VERSION, or store the old format "
                '(VALUE_FORMAT "plain" with SERIALIZER "pickle" is django-redis\'s and '
                "RedisCache's) until every process runs the new settings; if the two caches "
                "use different servers, silence sentinel_cache.W007 (docs/migration.md).",
                obj=alias,
                id="sentinel_cache.W007",
            )
        )
    return messages


def check_deployment(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    """W001 for fewer than three sentinels; then every sentinel asked about every master:
    W002 unreachable sentinels, E005 when none answered, E006 addresses that are data nodes, not
    sentinels, E002 sentinels refusing our credentials, E003 a master that no sentinel monitors,
    W003 one that some sentinels do not monitor, W006 masters the sentinels monitor that MASTERS
    leaves out; I001 the sentinels that answered and the masters they named."""
    configs: dict[str, PoolConfig] = {}
    for alias, entry in sentinel_aliases().items():
        try:
            configs[alias] = pool_config(entry)
        except Exception:  # already reported as E001 by check_configuration
            continue
    messages: list[checks.CheckMessage] = []
    for alias, config in configs.items():
        count = len(config.sentinels)
        if count < MIN_SENTINELS:
            messages.append(
                checks.Warning(
                    f"only {count} sentinel{'s' if count != 1 else ''} "
                    f"configured; with fewer than {MIN_SENTINELS} the loss of one machine can "
                    f"leave no majority to agree on a failover.",
                    hint="Run at least three sentinels on independent machines and list them all.",
                    obj=alias,
                    id="sentinel_cache.W001",
                )
            )
    # Every sentinel of every alias at once: a black-holed one costs one short timeout, and the
    # whole check about DEPLOY_DEADLINE.
    tasks = {
        alias: functools.partial(
            probe_sentinels,
            config.sentinels,
            config.sentinel_options(),
            timeout=DEPLOY_PING_TIMEOUT,
            masters=config.masters,
        )
        for alias, config in configs.items()
    }
    outcomes = run_all(tasks, time.monotonic() + DEPLOY_DEADLINE, "deploy check")
    for alias, config in configs.items():
        outcome = outcomes[alias]
        if isinstance(outcome, BaseException):  # past the deadline: no answer from any of them
            error = f"{type(outcome).__name__}: {outcome}"
            outcome = [SentinelProbe(address, error=error) for address in config.sentinels]
        messages += _sentinel_messages(alias, config, outcome)
    return messages


def _sentinel_messages(
    alias: str, config: PoolConfig, probes: Sequence[SentinelProbe]
) -> list[checks.CheckMessage]:
    """What the sentinels' answers say about this alias: silence is a warning (the machine
    running the check may not reach production), a refusal or an unknown master an error."""
    total = len(config.sentinels)
    messages: list[checks.CheckMessage] = []
    failed = [f"{p.address} ({p.error})" for p in probes if p.state == "unreachable"]
    answering = [p for p in probes if p.reachable]
    data_nodes = [p for p in probes if p.state == SENTINEL_NOT_SENTINEL]
    if data_nodes:
        messages.append(
            checks.Error(
                f"{len(data_nodes)} of {total} addresses in LOCATION "
                f"{'is a Redis data node' if len(data_nodes) == 1 else 'are Redis data nodes'}, "
                f"not {'a sentinel' if len(data_nodes) == 1 else 'sentinels'}: "
                + "; ".join(
                    f"{p.address} ({'ROLE ' + p.role + ', ' if p.role else ''}{p.error})"
                    for p in data_nodes
                ),
                hint="LOCATION must hold the sentinels' host:port (their port is 26379 by "
                "default), not the masters' or replicas': the sentinels name the masters.",
                obj=alias,
                id="sentinel_cache.E006",
            )
        )
    refused_all = all(p.state == "auth_refused" for p in probes)
    if not answering and not refused_all:  # refusals alone are E002's
        messages.append(
            checks.Error(
                f"no sentinel answered: none of the {total} addresses in LOCATION is a sentinel "
                f"this machine can ask ({'; '.join(f'{p.address}: {p.error}' for p in probes)}); "
                "the cache cannot find any master.",
                hint="Check the addresses (the sentinels', not the data nodes') and firewalls; "
                "run the check where production's network is reachable. `manage.py "
                "sentinel_status` shows the whole topology.",
                obj=alias,
                id="sentinel_cache.E005",
            )
        )
    elif failed:
        messages.append(
            checks.Warning(
                f"{len(failed)} of {total} sentinels unreachable: {'; '.join(failed)}",
                hint=(
                    "Check the addresses and firewalls; `manage.py sentinel_status` shows the "
                    "whole topology."
                ),
                obj=alias,
                id="sentinel_cache.W002",
            )
        )
    if answering:
        messages.append(
            checks.Info(_answered(answering, config), obj=alias, id="sentinel_cache.I001")
        )
    unlisted = unlisted_masters(probes, [*config.masters, *config.previous_masters])
    if unlisted:
        messages.append(
            checks.Warning(
                unlisted_warning(unlisted),
                hint="On sentinels shared with another application, silence "
                "sentinel_cache.W006 (SILENCED_SYSTEM_CHECKS).",
                obj=alias,
                id="sentinel_cache.W006",
            )
        )
    views = [master_view(name, probes) for name in config.masters]
    answered = {p.address for p in probes if p.reachable}
    refused = [f"{p.address} ({p.refused}: {p.error})" for p in probes if p.refused]
    hints = [p.hint for p in probes if p.refused and p.hint]
    for view in views:  # an ACL user may connect, yet be denied the questions about a master
        refused += [f"{a} for {view.name!r} ({why})" for a, why in view.refused if a in answered]
        hints += view.hints
    if refused:
        messages.append(
            checks.Error(
                f"authentication refused by {len(refused)} of {total} sentinels: "
                f"{'; '.join(refused)}",
                hint="; ".join(dict.fromkeys(hints)),
                obj=alias,
                id="sentinel_cache.E002",
            )
        )
    for view in views:
        if view.problem == NOT_MONITORED:
            silent = total - len(view.not_monitoring)
            messages.append(
                checks.Error(
                    f"master {view.name!r} is not monitored by any sentinel that answered: "
                    f"asked {', '.join(map(str, view.not_monitoring))}"
                    f"{f' ({silent} more did not answer)' if silent else ''}"
                    f"{view.suggestion()}",
                    hint="Check MASTERS against the sentinels' `sentinel monitor <name> ...` "
                    "lines (names are case-sensitive).",
                    obj=alias,
                    id="sentinel_cache.E003",
                )
            )
        elif view.problem is None and view.not_monitoring:
            messages.append(
                checks.Warning(
                    f"master {view.name!r} is not monitored by "
                    f"{', '.join(map(str, view.not_monitoring))} ({len(view.naming)} of "
                    f"{total} sentinels name {view.address}): those cannot vote in its failover.",
                    hint="Every sentinel should monitor every master of this cache.",
                    obj=alias,
                    id="sentinel_cache.W003",
                )
            )
    return messages


def _answered(answered: Sequence[SentinelProbe], config: PoolConfig) -> str:
    """ "sentinels answered: a (shard_a -> host:port, shard_b -> ...); b (...)": what the check
    confirmed, so a passing deploy check says it asked and what it heard."""
    rows = []
    for probe in answered:
        named = []
        for name in config.masters:
            answer = probe.masters.get(name)
            if isinstance(answer, BaseException):
                named.append(f"{name}: error")
            else:
                named.append(f"{name} -> {answer if answer is not None else 'not monitored'}")
        rows.append(f"{probe.address} ({', '.join(named)})")
    return f"{len(answered)} of {len(config.sentinels)} sentinels answered: {'; '.join(rows)}"


def check_django_redis_settings(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    """django-redis settings that do not carry over, never silently ignored (see
    :mod:`sentinel_cache.django.compat` for those that do): W004 for a ``DJANGO_REDIS_*`` global
    or a ``REVERSE_KEY_FUNCTION`` with no effect here, W005 for ``LOG_IGNORED_EXCEPTIONS =
    False`` on a cache that ignores exceptions (they are always logged here, rate-limited)."""
    aliases = sentinel_aliases()
    if not aliases:
        return []
    messages: list[checks.CheckMessage] = []
    names = ", ".join(map(repr, aliases))
    for name in sorted(dir(settings)):
        django_redis = name.startswith("DJANGO_REDIS_") or name in NO_EFFECT_GLOBALS
        if django_redis and name not in HONOURED_GLOBALS:
            why = NO_EFFECT_GLOBALS.get(name, "sentinel_cache reads no such setting")
            messages.append(
                checks.Warning(
                    f"settings.{name} has no effect on the sentinel caches ({names}): {why}.",
                    hint="Remove it (or silence sentinel_cache.W004 while django-redis caches "
                    "still read it); docs/migration.md lists what carries over.",
                    obj=f"settings.{name}",
                    id="sentinel_cache.W004",
                )
            )
    for alias, entry in aliases.items():
        if "REVERSE_KEY_FUNCTION" in entry:
            messages.append(
                checks.Warning(
                    "REVERSE_KEY_FUNCTION (django-redis's) has no effect: with a custom "
                    "KEY_FUNCTION, iter_keys yields the keys as stored.",
                    hint="Remove it; reverse the stored keys yourself if you need the originals.",
                    obj=alias,
                    id="sentinel_cache.W004",
                )
            )
        try:
            ignoring = build_backend(entry).cache_options.ignore_exceptions
            switch = log_every_ignored(entry.get("OPTIONS") or {}, settings)
        except Exception:  # reported as E001 by check_configuration
            continue
        if ignoring and switch is not None and not switch[0]:
            messages.append(
                checks.Warning(
                    f"{switch[1]} = False does not silence the exceptions IGNORE_EXCEPTIONS "
                    "ignores: they are always logged here, at most once per shard every "
                    "LOG_IGNORED_EXCEPTIONS_INTERVAL seconds.",
                    hint="Raise LOG_IGNORED_EXCEPTIONS_INTERVAL, or filter the logger "
                    "(sentinel_cache.django, or DJANGO_REDIS_LOGGER's).",
                    obj=alias,
                    id="sentinel_cache.W005",
                )
            )
    return messages


def register() -> None:
    """Called by the app config's ready(); registering twice is harmless (a set)."""
    checks.register(check_configuration, checks.Tags.caches, TAG)
    checks.register(check_django_redis_settings, checks.Tags.caches, TAG)
    checks.register(check_previous_cache, checks.Tags.caches, TAG)
    checks.register(check_deployment, checks.Tags.caches, TAG, deploy=True)
    checks.register(check_previous_format, checks.Tags.caches, TAG, deploy=True)
