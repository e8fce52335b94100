"""Nemeses and a runner for the features' own multi-step work (issue 35, phase 2b): resharding
(``PREVIOUS_MASTERS`` with the migration running, a failover landed mid-batch), the near cache
(a second process writing), a fork during traffic, and Valkey 9's coordinated failover.

:func:`run_feature` is :func:`history.scenarios.run` with what these scenarios need beyond it:
a ``prepare`` step in the parent (keys written through the *previous* ring before the clients
start: those writes join the history as acknowledged ``set`` ops of the client ``prefill``), a
chosen target master, and the recorder's start method (``fork`` for the fork scenario).
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any
from unittest import mock

from sentinel_cache.testing import LocalSentinelCluster

from . import nemeses
from .checker import Modes, Verdict
from .nemeses import NEMESES
from .recorder import ADAPTERS, OK, Adapter, CoreAdapter, Op, Workload
from .scenarios import Scenario, judged, plan_for, record

_RUNS = itertools.count()

#: Resharding: the ring grows from the first two masters to three (an append, as
#: docs/resharding.md advises): about a third of the keys move, all to the third master.
RESHARD_TOPOLOGY: dict[str, Any] = {"shards": 3, "replicas": 1, "sentinels": 3, "faults": True}
PREVIOUS = ["shard0", "shard1"]
GROWN = {"PREVIOUS_MASTERS": PREVIOUS}

#: The migration's pace: 20 keys a second is 2 keys a batch (``rate / 10``), so the dozen
#: moving keys of a run take about six batches, long enough for clients and a failover to
#: land between them.
MIGRATION_RATE = 20.0


def core_pool(cluster: LocalSentinelCluster, options: Mapping[str, Any]) -> Any:
    """A ``ShardedSentinelPool`` in this (the parent) process, for the prefill and the
    migration."""
    from sentinel_cache.core.config import parse_cache_config
    from sentinel_cache.core.topology.sharded_pool import ShardedSentinelPool

    config, _ = parse_cache_config(
        [tuple(a) for a in cluster.sentinel_addresses],
        {"MASTERS": list(cluster.master_names), **options},
    )
    return ShardedSentinelPool.from_config(config)


def moving_workload(
    prefix: str, cluster: LocalSentinelCluster, moving_keys: int = 8, staying_keys: int = 4
) -> Workload:
    """Hot keys of which ``moving_keys`` move (their previous owner is another shard) and
    ``staying_keys`` stay: the moving ones are what resharding's rules are about."""
    pool = core_pool(cluster, GROWN)
    try:
        moving: list[str] = []
        staying: list[str] = []
        for n in itertools.count():
            key = f"{prefix}:k{n}"
            (moving if pool.previous_shard_for(key) is not None else staying).append(key)
            if len(moving) >= moving_keys and len(staying) >= staying_keys:
                break
        counters = tuple(f"{prefix}:c{i}" for i in range(3))
        return Workload(tuple(moving[:moving_keys] + staying[:staying_keys]), counters)
    finally:
        pool.close()


def prefill_previous(cluster: LocalSentinelCluster, workload: Workload) -> list[Op]:
    """Every register key written through the previous ring (the cache as it was before the
    deployment), recorded as acknowledged writes: a read of such a value names its write."""
    from sentinel_cache.core.ops.client import CacheClient
    from sentinel_cache.core.serializers import Codec

    pool = core_pool(cluster, {"MASTERS": PREVIOUS})
    client = CacheClient(pool, Codec())
    ops = []
    try:
        for n, key in enumerate(workload.keys):
            value = f"prefill:{n}"
            invoke = time.monotonic()
            done = client.set(key, value, None)
            ops.append(
                Op(-1, "prefill", n, "set", (key,), (value,), invoke, time.monotonic(), OK, done)
            )
            assert done, f"prefill of {key} through {PREVIOUS} not stored"
    finally:
        pool.close()
    return ops


# ------------------------------------------------------------------------- nemeses


def migration(
    during: Callable[[nemeses.Context], str] | None = None, *, step: str = "_restore"
) -> nemeses.Strike:
    """The resharding migration (``sentinel_cache.core.admin.reshard.migrate``, at
    :data:`MIGRATION_RATE`) run in this process while the clients work; with ``during``, that
    strike lands inside the migration's first batch: ``Migration._restore`` (the owners' half:
    after the source's ``DUMP``, before the ``RESTORE``) or ``_dump`` pauses there until it is
    over. The patch is the parent's only (the migration runs here), never shipped code."""

    def strike(ctx: nemeses.Context) -> str:
        from sentinel_cache.core.admin.reshard import migration as module

        pool = core_pool(ctx.cluster, GROWN)
        landed: list[str] = []
        original = getattr(module.Migration, step)
        gate = threading.Lock()

        def paused(self: Any, *args: Any, **kwargs: Any) -> Any:
            with gate:
                first = during is not None and not landed
                if first:
                    assert during is not None
                    landed.append(during(ctx))
            return original(self, *args, **kwargs)

        try:
            with mock.patch.object(module.Migration, step, paused):
                report = module.migrate(pool, rate=MIGRATION_RATE, batch=2, retry_for=30)
        finally:
            pool.close()
        moved = sum(s.moved for s in report.shards)
        present = sum(s.already_present for s in report.shards)
        where = f"; inside {step} of the first batch: {landed[0]}" if landed else ""
        return (
            f"migration {PREVIOUS} -> {ctx.cluster.master_names}: moved {moved}, "
            f"{present} already on their owner, complete {report.complete}{where}"
        )

    return strike


def coordinated_failover(ctx: nemeses.Context) -> str:
    """``SENTINEL FAILOVER <name> COORDINATED`` (Valkey 9.0 and later): the old master stops
    taking writes and waits for the replica to catch up before the promotion. Over when every
    sentinel names the new master."""
    old = ctx.cluster.master_address(ctx.target)
    errors = []
    for index in range(len(ctx.cluster.sentinel_addresses)):
        sentinel = ctx.cluster.sentinel_client(index, socket_timeout=5)
        try:
            sentinel.execute_command("SENTINEL", "FAILOVER", ctx.target, "COORDINATED")
            break
        except Exception as exc:  # noqa: BLE001 - the next sentinel, as cluster.failover does
            errors.append(f"{ctx.cluster.sentinel_addresses[index]}: {exc}")
        finally:
            sentinel.close()
    else:
        raise RuntimeError(f"no sentinel accepted SENTINEL FAILOVER COORDINATED: {errors}")
    new = ctx.cluster.wait_for_master_change(ctx.target, old, timeout=30)
    return f"{ctx.target}: coordinated {old[0]}:{old[1]} -> {new[0]}:{new[1]}"


NEMESES.update(
    {
        "reshard migration": migration(),
        "reshard migration, planned failover inside a batch": migration(nemeses.planned_failover),
        "coordinated failover": coordinated_failover,
    }
)


# ------------------------------------------------------------------------- fork

#: The client a forked process inherits (built and used by the parent before the fork).
_INHERITED: dict[str, Any] = {}


def inherit(cluster: LocalSentinelCluster, options: Mapping[str, Any], keys: Any) -> Any:
    """Build a core client in this process and use it (every shard connected, the near cache
    filled when on), so that the processes forked next inherit a pool in use."""
    from sentinel_cache.core.ops.client import CacheClient
    from sentinel_cache.core.serializers import Codec

    pool = core_pool(cluster, options)
    client = CacheClient(pool, Codec())
    for key in keys:
        client.get(key)
    _INHERITED["client"] = client
    return client


def _inherited_build(sentinels: Any, options: Mapping[str, Any]) -> Callable[[], Adapter]:
    """``ADAPTERS["inherited"]``: the client the parent built before the fork (see
    :func:`inherit`), shared by the threads of each forked process."""
    client = _INHERITED["client"]
    return lambda: CoreAdapter(client, 0.5)


ADAPTERS.update({"inherited": _inherited_build})


# ------------------------------------------------------------------------- warm adoption

#: The old cache of the adoption scenarios: django-redis (pickle) on a plain server of its own,
#: with our KEY_PREFIX, as a site switching from django-redis runs (tests/adoption_support.py).
#: Its address travels in the plan's options under this name (popped before our backend
#: parses them).
OLD = "_HISTORY_OLD_CACHE"
ADOPTING_PREFIX = "hist"  # DjangoAdapter's KEY_PREFIX, shared by the old cache


def old_entry(old: tuple[str, int], ignore_exceptions: bool = False) -> dict[str, Any]:
    """The old cache's CACHES entry (django-redis), with or without IGNORE_EXCEPTIONS."""
    return {
        "BACKEND": "django_redis.cache.RedisCache",
        "LOCATION": f"redis://{old[0]}:{old[1]}/0",
        "KEY_PREFIX": ADOPTING_PREFIX,
        "TIMEOUT": None,
        "OPTIONS": {"IGNORE_EXCEPTIONS": ignore_exceptions, "SOCKET_TIMEOUT": 0.5},
    }


def _adopting_build(sentinels: Any, options: Mapping[str, Any]) -> Callable[[], Adapter]:
    """``ADAPTERS["django adopting"]``: the Django backend with ``PREVIOUS_CACHE`` naming the
    old django-redis cache (``options[OLD]``: its CACHES entry). Returns a plain function (it
    also sets Django up in the migration's process)."""
    import django
    from django.conf import settings

    from .recorder import DjangoAdapter

    ours = {k: v for k, v in options.items() if k != OLD}
    if not settings.configured:
        settings.configure(
            INSTALLED_APPS=[],
            USE_TZ=True,
            CACHES={
                "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
                "old": dict(options[OLD]),
                "history": {
                    "BACKEND": "sentinel_cache.django.ShardedSentinelCache",
                    "LOCATION": [f"{h}:{p}" for h, p in sentinels],
                    "KEY_PREFIX": ADOPTING_PREFIX,
                    "TIMEOUT": None,
                    "OPTIONS": {**ours, "PREVIOUS_CACHE": "old"},
                },
            },
        )
        django.setup()
    from django.core.cache import caches

    return partial(DjangoAdapter, caches["history"])


ADAPTERS.update({"django adopting": _adopting_build})


def prefill_old(old: tuple[str, int], workload: Workload) -> list[Op]:
    """Every register key written on the old cache only, as django-redis stores it (a pickle
    under ``KEY_PREFIX:1:key``), recorded as acknowledged writes."""
    import pickle

    import redis

    server = redis.Redis(host=old[0], port=old[1], socket_timeout=5)
    ops = []
    try:
        for start in range(0, len(workload.keys), 500):
            pipe = server.pipeline(transaction=False)
            batch = list(enumerate(workload.keys))[start : start + 500]
            for n, key in batch:
                value = pickle.dumps(f"old:{n}", pickle.DEFAULT_PROTOCOL)
                pipe.set(f"{ADOPTING_PREFIX}:1:{key}", value)
            invoke = time.monotonic()
            done = pipe.execute()
            complete = time.monotonic()
            assert all(done), f"prefill on the old cache not stored: {done}"
            ops += [
                Op(-1, "prefill", n, "set", (key,), (f"old:{n}",), invoke, complete, OK, True)
                for n, key in batch
            ]
    finally:
        server.close()
    return ops


def frozen_old(old: LocalSentinelCluster, seconds: float = 1.5) -> nemeses.Strike:
    """SIGSTOP of the old cache's server for ``seconds`` (longer than its 0.5 s socket
    timeout: its calls fail), then SIGCONT."""

    def strike(ctx: nemeses.Context) -> str:
        address = old.master_address(old.master_names[0])
        old.freeze_node(address)
        try:
            time.sleep(seconds)
        finally:
            old.thaw_node(address)
        return f"old cache {address[0]}:{address[1]} frozen {seconds}s"

    return strike


def paused_old_writes(old: LocalSentinelCluster, seconds: float = 1.5) -> nemeses.Strike:
    """``CLIENT PAUSE WRITE`` on the old cache's server for ``seconds``: its reads answer, its
    writes wait past the 0.5 s socket timeout and fail. Unlike a freeze, a write given up on
    never runs (its client is gone when the pause ends), so an old copy a failed delete left
    stays there."""

    def strike(ctx: nemeses.Context) -> str:
        address = old.master_address(old.master_names[0])
        admin = old.node_client(address)
        try:
            admin.execute_command("CLIENT", "PAUSE", int(seconds * 1000), "WRITE")
            time.sleep(seconds)
        finally:
            admin.execute_command("CLIENT", "UNPAUSE")
            admin.close()
        return f"old cache {address[0]}:{address[1]} writes paused {seconds}s"

    return strike


def fail_open_old(slack: float) -> Callable[[list[Any]], Modes]:
    """A read of a key only the old cache has, while that cache fails and its backend's
    ``IGNORE_EXCEPTIONS`` is on, is a miss (docs/migration.md): misses allowed from each
    fault's start to its end plus ``slack`` (the old side's socket timeout and more)."""

    def modes(events: list[Any]) -> Modes:
        return Modes(
            misses=tuple((e.start, e.end + slack) for e in events),
            why="IGNORE_EXCEPTIONS on the old cache: its outage answers misses",
        )

    return modes


# ------------------------------------------------------------------------- the runner

#: A spawned client process knows only recorder.py's adapters: this no-op patch (the first of
#: the plan's) imports this module there, registering the adapters above.
registered = True


def unchanged(original: Any) -> Any:
    return original


REGISTER = ("history.nemeses_features:registered", "history.nemeses_features:unchanged")


@dataclass(frozen=True)
class Feature:
    """What a feature scenario adds to a :class:`~history.scenarios.Scenario`."""

    scenario: Scenario
    target: str = "shard0"
    reshard: bool = False  # moving keys, prefilled through the previous ring
    moving_keys: int = 8  # with reshard: how many of the hot keys move (4 more stay)
    old: tuple[str, int] | None = None  # warm adoption: the old cache's server (prefilled)
    keys: int = 12  # hot register keys (without reshard)
    context: str = "spawn"
    modes_from_events: Callable[[list[Any]], Modes] | None = None

    @property
    def name(self) -> str:
        return self.scenario.name


def run_feature(feature: Feature, cluster: LocalSentinelCluster, run_seed: int) -> Verdict:
    """Record and judge ``feature`` on ``cluster`` (as :func:`history.scenarios.run`)."""
    scenario = feature.scenario
    slug = "".join(c if c.isalnum() else "-" for c in scenario.name)[:24]
    prefix = f"h{run_seed}.{next(_RUNS)}:{slug}"
    if feature.reshard:
        workload = moving_workload(prefix, cluster, feature.moving_keys)
        prefilled = prefill_previous(cluster, workload)
    elif feature.old is not None:
        workload = Workload.hot(prefix, keys=feature.keys)
        prefilled = prefill_old(feature.old, workload)
    else:
        workload = Workload.hot(prefix, keys=feature.keys)
        prefilled = []
    options = {"MASTERS": list(cluster.master_names), **scenario.options}
    if scenario.adapter == "inherited":
        inherit(cluster, options, workload.keys)
    plan = plan_for(scenario, cluster, options, workload, run_seed, patches=(REGISTER,))
    try:
        history, events, settled = record(
            scenario, cluster, plan, target=feature.target, context=feature.context
        )
    finally:
        inherited = _INHERITED.pop("client", None)
        if inherited is not None:
            inherited.core.close()
    history.ops = sorted(prefilled + history.ops, key=lambda op: op.invoke)
    history.events = events
    modes = (
        scenario.modes if feature.modes_from_events is None else feature.modes_from_events(events)
    )
    return judged(scenario, history, modes, settled)
