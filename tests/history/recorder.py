"""The history recorder: N client threads in each of M processes issue random operations on a
few hot keys through a public API, and every operation becomes one plain :class:`Op` record.

Three tables make it extensible, each one entry per thing:

* :data:`OPS` (op name -> :class:`OpSpec`): how to pick its arguments, how to call it through an
  :class:`Adapter`, and what its outcome means to the checker's models (:func:`effects`). A new
  operation (a hash, a lock, a session) is one entry here plus, if it needs one, one adapter
  method and one effect kind the checker understands.
* :data:`ADAPTERS` (name -> factory): the public API the clients go through (``"core"``: the
  sync ``CacheClient``; ``"async"``: ``AsyncCacheClient``, one event loop per thread;
  ``"async-shared"``: one event loop per process shared by its client threads;
  ``"django"``: ``django.core.cache.caches``).
* :class:`StepHook`: a point inside the library at which a client pauses until the parent's
  nemesis has struck ("when the operation reaches step X, fire the nemesis").

Every written value is unique (``p<process>t<thread>:<seq>``), so a read names the write it saw.
Times are ``time.monotonic()`` (CLOCK_MONOTONIC: one clock for every process on Linux).
"""

from __future__ import annotations

import importlib
import multiprocessing
import os
import pickle
import random
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

OK = "ok"  # the operation returned: its value is the outcome
FAIL = "fail"  # it definitely did not take effect (e.g. incr of a missing key: ValueError)
INFO = "info"  # it raised something else: it may or may not take effect, at any time from invoke


@dataclass(frozen=True)
class Op:
    """One operation as a client saw it (plain and picklable)."""

    process: int
    client: str
    seq: int
    name: str  # an OPS entry ("final_get": the read after the dust settled)
    keys: tuple[str, ...]
    args: tuple[Any, ...]  # what it wrote: (value,), (delta,), (mapping items...)
    invoke: float
    complete: float
    kind: str  # OK / FAIL / INFO
    value: Any = None  # the outcome when OK
    error: str = ""  # the exception when FAIL / INFO

    def describe(self, t0: float = 0.0) -> str:
        """One line of a bug report: who, what, when (relative to ``t0``), how it came out."""
        args = ", ".join(repr(a) for a in (*self.keys, *self.args))
        outcome = repr(self.value) if self.kind == OK else self.error or "-"
        return (
            f"{self.client:>7} {self.name}({args}) {self.kind} -> {outcome}  "
            f"[{self.invoke - t0:.4f}, {self.complete - t0:.4f}]"
        )


@dataclass(frozen=True)
class Event:
    """A nemesis's fault, with when it began and ended."""

    name: str
    start: float
    end: float
    detail: str = ""


# --------------------------------------------------------------------------- effects
# What an op did to the checker's models. "certain": it took effect within [invoke, complete];
# not certain: it may have, at any time from invoke on (an exception, a partial result).


@dataclass(frozen=True)
class Write:
    key: str
    value: Any
    certain: bool


@dataclass(frozen=True)
class Delete:
    key: str
    certain: bool


@dataclass(frozen=True)
class Read:
    key: str
    value: Any  # None: a miss
    final: bool = False


@dataclass(frozen=True)
class Incr:
    key: str
    delta: int
    certain: bool
    result: int | None = None  # the value it returned (certain only)


@dataclass(frozen=True)
class Stored:
    """get_or_set returned ``value``: it is stored unless something changed the key since."""

    key: str
    value: Any


@dataclass(frozen=True)
class CounterMissing:
    """incr said the counter does not exist (it was created before the run, never deleted)."""

    key: str


Effect = Write | Delete | Read | Incr | Stored | CounterMissing


def _write(op: Op, key: str, value: Any) -> list[Effect]:
    """A plain or conditional write: True stored it, False did nothing, info maybe."""
    if op.kind == OK:
        return [Write(key, value, True)] if op.value else []
    return [Write(key, value, False)] if op.kind == INFO else []


def _delete(op: Op) -> list[Effect]:
    if op.kind == FAIL:
        return []
    return [Delete(k, op.kind == OK) for k in op.keys]


def _read(op: Op) -> list[Effect]:
    return [Read(op.keys[0], op.value, op.name == "final_get")] if op.kind == OK else []


def _read_many(op: Op) -> list[Effect]:
    return [Read(k, op.value.get(k)) for k in op.keys] if op.kind == OK else []


def _set_many(op: Op) -> list[Effect]:
    if op.kind == FAIL:
        return []
    failed = set(op.value or ()) if op.kind == OK else set(op.keys)
    return [Write(k, v, op.kind == OK and k not in failed) for k, v in op.args]


def _incr(op: Op) -> list[Effect]:
    (delta,) = op.args
    if op.kind == OK:
        return [Incr(op.keys[0], delta, True, op.value)]
    if op.kind == INFO:
        return [Incr(op.keys[0], delta, False)]
    return [CounterMissing(op.keys[0])]


def _get_or_set(op: Op) -> list[Effect]:
    key, value = op.keys[0], op.args[0]
    if op.kind == INFO:
        return [Write(key, value, False)]
    if op.kind != OK:
        return []
    if op.value == value:  # its own computation: stored (or a delete raced it)
        return [Write(key, value, True), Stored(key, value)]
    # another's value: read; its own may still have been stored first (the plain path adds,
    # then reads, and a write may come in between)
    return [Write(key, value, False), Read(key, op.value), Stored(key, op.value)]


# --------------------------------------------------------------------------- the op table


class Adapter:
    """The calls a client makes, through one public API. Timeouts are None (never expire)."""

    def get(self, key: str) -> Any:
        raise NotImplementedError

    def get_many(self, keys: Sequence[str]) -> dict[str, Any]:
        raise NotImplementedError

    def set(self, key: str, value: Any, *, nx: bool = False, xx: bool = False) -> bool:
        raise NotImplementedError

    def add(self, key: str, value: Any) -> bool:
        raise NotImplementedError

    def delete(self, key: str) -> Any:
        raise NotImplementedError

    def delete_many(self, keys: Sequence[str]) -> Any:
        raise NotImplementedError

    def set_many(self, mapping: Mapping[str, Any]) -> list[str]:
        """The keys not stored."""
        raise NotImplementedError

    def incr(self, key: str, delta: int) -> int:
        raise NotImplementedError

    def touch(self, key: str) -> bool:
        raise NotImplementedError

    def get_or_set(self, key: str, value: Any, stampede: bool, seconds: float = 0.0) -> Any:
        """``stampede``: the default is a callable (computed under the stampede lock where the
        API has one); ``seconds``: how long that computation takes."""
        raise NotImplementedError

    def close(self) -> None:
        pass


@dataclass
class Workload:
    """The keys a run works on: registers (values) and counters (incr/decr only)."""

    keys: tuple[str, ...]
    counters: tuple[str, ...]

    @classmethod
    def hot(cls, prefix: str, keys: int = 12, counters: int = 3) -> Workload:
        return cls(
            tuple(f"{prefix}:k{i}" for i in range(keys)),
            tuple(f"{prefix}:c{i}" for i in range(counters)),
        )


Args = tuple[tuple[str, ...], tuple[Any, ...]]


@dataclass(frozen=True)
class OpSpec:
    """One operation: ``make(rng, workload, value)`` picks (keys, args) (``value`` is a fresh
    unique value, call it for each one needed); ``call(adapter, keys, args)`` makes the call;
    ``effects(op)`` says what the recorded outcome did to the models; ``result`` turns the
    call's return into a plain recorded value."""

    make: Callable[[random.Random, Workload, Callable[[], str]], Args]
    call: Callable[[Adapter, tuple[str, ...], tuple[Any, ...]], Any]
    effects: Callable[[Op], list[Effect]]
    result: Callable[[Any], Any] = lambda r: r
    weight: int = 1


def _one(rng: random.Random, w: Workload, value: Callable[[], str]) -> Args:
    return (rng.choice(w.keys),), ()


def _one_value(rng: random.Random, w: Workload, value: Callable[[], str]) -> Args:
    return (rng.choice(w.keys),), (value(),)


def _some(rng: random.Random, w: Workload, value: Callable[[], str]) -> Args:
    return tuple(rng.sample(w.keys, rng.randint(2, 4))), ()


def _some_values(rng: random.Random, w: Workload, value: Callable[[], str]) -> Args:
    keys = tuple(rng.sample(w.keys, rng.randint(2, 4)))
    return keys, tuple((k, value()) for k in keys)


def _counter(sign: int) -> Callable[[random.Random, Workload, Callable[[], str]], Args]:
    def make(rng: random.Random, w: Workload, value: Callable[[], str]) -> Args:
        return (rng.choice(w.counters),), (sign * rng.randint(1, 5),)

    return make


def _get_or_set_args(
    stampede: bool,
) -> Callable[[random.Random, Workload, Callable[[], str]], Args]:
    def make(rng: random.Random, w: Workload, value: Callable[[], str]) -> Args:
        return (rng.choice(w.keys),), (value(), stampede)

    return make


def _get_or_set_slow(rng: random.Random, w: Workload, value: Callable[[], str]) -> Args:
    return (rng.choice(w.keys),), (value(), True, 0.3)


OPS: dict[str, OpSpec] = {
    "get": OpSpec(_one, lambda a, k, x: a.get(k[0]), _read, weight=6),
    "get_many": OpSpec(_some, lambda a, k, x: a.get_many(k), _read_many, result=dict, weight=3),
    "set": OpSpec(
        _one_value,
        lambda a, k, x: a.set(k[0], x[0]),
        lambda op: _write(op, *op.keys, *op.args),
        weight=4,
    ),
    "set_nx": OpSpec(
        _one_value,
        lambda a, k, x: a.set(k[0], x[0], nx=True),
        lambda op: _write(op, *op.keys, *op.args),
    ),
    "set_xx": OpSpec(
        _one_value,
        lambda a, k, x: a.set(k[0], x[0], xx=True),
        lambda op: _write(op, *op.keys, *op.args),
    ),
    "add": OpSpec(
        _one_value, lambda a, k, x: a.add(k[0], x[0]), lambda op: _write(op, *op.keys, *op.args)
    ),
    "delete": OpSpec(_one, lambda a, k, x: a.delete(k[0]), _delete, weight=2),
    "delete_many": OpSpec(_some, lambda a, k, x: a.delete_many(k), _delete),
    "set_many": OpSpec(
        _some_values, lambda a, k, x: a.set_many(dict(x)), _set_many, result=list, weight=2
    ),
    "incr": OpSpec(_counter(1), lambda a, k, x: a.incr(k[0], x[0]), _incr, weight=2),
    "decr": OpSpec(_counter(-1), lambda a, k, x: a.incr(k[0], x[0]), _incr),
    "touch": OpSpec(_one, lambda a, k, x: a.touch(k[0]), lambda op: []),
    "get_or_set": OpSpec(
        _get_or_set_args(True), lambda a, k, x: a.get_or_set(k[0], *x), _get_or_set
    ),
    "get_or_set_plain": OpSpec(
        _get_or_set_args(False), lambda a, k, x: a.get_or_set(k[0], *x), _get_or_set
    ),
    # a computation of 0.3 s (longer than a short STAMPEDE_LOCK_TIMEOUT: issue 36, finding 6)
    "get_or_set_slow": OpSpec(
        _get_or_set_slow, lambda a, k, x: a.get_or_set(k[0], *x), _get_or_set, weight=0
    ),
    # the read of every key once the dust settled (made by the recorder, never drawn)
    "final_get": OpSpec(_one, lambda a, k, x: a.get(k[0]), _read, weight=0),
    # a counter's creation before the run (never drawn)
    "init_counter": OpSpec(
        _one,
        lambda a, k, x: a.set(k[0], 0),
        lambda op: [Incr(op.keys[0], 0, True, 0)] if op.kind == OK and op.value else [],
        weight=0,
    ),
}


def effects(op: Op) -> list[Effect]:
    """What ``op`` did to the models, by its OPS entry."""
    return OPS[op.name].effects(op)


# --------------------------------------------------------------------------- adapters


def computation(value: Any, seconds: float) -> Callable[[], Any]:
    """A get_or_set default that takes ``seconds`` to compute ``value``."""

    def compute() -> Any:
        if seconds:
            time.sleep(seconds)
        return value

    return compute


class CoreAdapter(Adapter):
    """The sync core client, ``CacheClient`` over a ``ShardedSentinelPool`` built from the
    Django-style OPTIONS (one pool per process, shared by its threads)."""

    def __init__(self, client: Any, lock_timeout: float) -> None:
        self.client = client
        self.lock_timeout = lock_timeout

    @classmethod
    def build(cls, sentinels: Any, options: Mapping[str, Any]) -> Callable[[], Adapter]:
        from sentinel_cache.core.config import parse_cache_config
        from sentinel_cache.core.ops.client import CacheClient
        from sentinel_cache.core.serializers import Codec
        from sentinel_cache.core.topology.sharded_pool import ShardedSentinelPool

        config, cache_options = parse_cache_config(sentinels, options)
        pool = ShardedSentinelPool.from_config(config)
        client = CacheClient(pool, Codec())
        return lambda: cls(client, cache_options.stampede_lock_timeout)

    def __repr__(self) -> str:
        return f"<CoreAdapter {self.client.core!r}>"

    def get(self, key: str) -> Any:
        return self.client.get(key)

    def get_many(self, keys: Sequence[str]) -> dict[str, Any]:
        return self.client.get_many(keys)

    def set(self, key: str, value: Any, *, nx: bool = False, xx: bool = False) -> bool:
        return self.client.set(key, value, None, nx=nx, xx=xx)

    def add(self, key: str, value: Any) -> bool:
        return self.client.add(key, value, None)

    def delete(self, key: str) -> Any:
        return self.client.delete(key)

    def delete_many(self, keys: Sequence[str]) -> Any:
        return self.client.delete_many(keys)

    def set_many(self, mapping: Mapping[str, Any]) -> list[str]:
        return self.client.set_many(mapping, None)

    def incr(self, key: str, delta: int) -> int:
        return self.client.incr(key, delta)

    def touch(self, key: str) -> bool:
        return self.client.touch(key, None)

    def get_or_set(self, key: str, value: Any, stampede: bool, seconds: float = 0.0) -> Any:
        default = computation(value, seconds) if stampede else value
        return self.client.get_or_set(key, default, None, lock_timeout=self.lock_timeout)


class AsyncAdapter(Adapter):
    """``AsyncCacheClient`` on an event loop of the thread's own (one per client thread)."""

    def __init__(self, core: Any, lock_timeout: float) -> None:
        import asyncio

        from sentinel_cache.core.ops.aio import AsyncCacheClient
        from sentinel_cache.core.serializers import Codec

        self.loop = asyncio.new_event_loop()
        self.client = AsyncCacheClient(core, Codec())
        self.lock_timeout = lock_timeout

    @classmethod
    def build(cls, sentinels: Any, options: Mapping[str, Any]) -> Callable[[], Adapter]:
        from sentinel_cache.core.config import parse_cache_config
        from sentinel_cache.core.topology.sharded_pool import ShardedSentinelPool

        config, cache_options = parse_cache_config(sentinels, options)
        core = ShardedSentinelPool.from_config(config)
        return lambda: cls(core, cache_options.stampede_lock_timeout)

    def __repr__(self) -> str:
        return f"<AsyncAdapter {self.client.core!r}>"

    def _run(self, coro: Any) -> Any:
        return self.loop.run_until_complete(coro)

    def get(self, key: str) -> Any:
        return self._run(self.client.get(key))

    def get_many(self, keys: Sequence[str]) -> dict[str, Any]:
        return self._run(self.client.get_many(keys))

    def set(self, key: str, value: Any, *, nx: bool = False, xx: bool = False) -> bool:
        return self._run(self.client.set(key, value, None, nx=nx, xx=xx))

    def add(self, key: str, value: Any) -> bool:
        return self._run(self.client.add(key, value, None))

    def delete(self, key: str) -> Any:
        return self._run(self.client.delete(key))

    def delete_many(self, keys: Sequence[str]) -> Any:
        return self._run(self.client.delete_many(keys))

    def set_many(self, mapping: Mapping[str, Any]) -> list[str]:
        return self._run(self.client.set_many(mapping, None))

    def incr(self, key: str, delta: int) -> int:
        return self._run(self.client.incr(key, delta))

    def touch(self, key: str) -> bool:
        return self._run(self.client.touch(key, None))

    def get_or_set(self, key: str, value: Any, stampede: bool, seconds: float = 0.0) -> Any:
        default = computation(value, seconds) if stampede else value
        return self._run(self.client.get_or_set(key, default, None, lock_timeout=self.lock_timeout))

    def close(self) -> None:
        try:
            self._run(self.client.aclose())
        finally:
            self.loop.close()


class SharedLoopAdapter(AsyncAdapter):
    """``AsyncCacheClient`` on ONE event loop per process, run by a thread of its own and shared
    by every client thread: their calls are concurrent tasks of that loop (with
    ``ASYNC_MULTIPLEX``, queued on one connection per shard: what the mux is for)."""

    def __init__(self, core: Any, lock_timeout: float, shared: dict[str, Any]) -> None:
        from sentinel_cache.core.ops.aio import AsyncCacheClient
        from sentinel_cache.core.serializers import Codec

        self.shared = shared
        self.loop = shared["loop"]
        self.client = AsyncCacheClient(core, Codec())
        self.lock_timeout = lock_timeout
        with shared["lock"]:
            shared["open"] += 1

    @classmethod
    def build(cls, sentinels: Any, options: Mapping[str, Any]) -> Callable[[], Adapter]:
        import asyncio
        import threading

        from sentinel_cache.core.config import parse_cache_config
        from sentinel_cache.core.topology.sharded_pool import ShardedSentinelPool

        config, cache_options = parse_cache_config(sentinels, options)
        core = ShardedSentinelPool.from_config(config)
        loop = asyncio.new_event_loop()
        threading.Thread(target=loop.run_forever, name="history-shared-loop", daemon=True).start()
        shared = {"loop": loop, "lock": threading.Lock(), "open": 0}
        return lambda: cls(core, cache_options.stampede_lock_timeout, shared)

    def __repr__(self) -> str:
        return f"<SharedLoopAdapter {self.client.core!r}>"

    def _run(self, coro: Any) -> Any:
        import asyncio

        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def close(self) -> None:
        try:
            self._run(self.client.aclose())
        finally:
            with self.shared["lock"]:
                self.shared["open"] -= 1
                last = self.shared["open"] == 0
            if last:  # the loop's thread ends; the process exits after the history is sent
                self.loop.call_soon_threadsafe(self.loop.stop)


class DjangoAdapter(Adapter):
    """The Django backend through ``django.core.cache.caches["history"]`` (Django configured
    in this process with nothing but that cache)."""

    def __init__(self, cache: Any) -> None:
        self.cache = cache

    @classmethod
    def build(cls, sentinels: Any, options: Mapping[str, Any]) -> Callable[[], Adapter]:
        import django
        from django.conf import settings

        if not settings.configured:
            settings.configure(
                INSTALLED_APPS=[],
                USE_TZ=True,
                CACHES={
                    "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
                    "history": {
                        "BACKEND": "sentinel_cache.django.ShardedSentinelCache",
                        "LOCATION": [f"{h}:{p}" for h, p in sentinels],
                        "KEY_PREFIX": "hist",
                        "TIMEOUT": None,
                        "OPTIONS": dict(options),
                    },
                },
            )
            django.setup()
        from django.core.cache import caches

        return lambda: cls(caches["history"])

    def __repr__(self) -> str:
        return f"<DjangoAdapter {self.cache!r}>"

    def get(self, key: str) -> Any:
        return self.cache.get(key)

    def get_many(self, keys: Sequence[str]) -> dict[str, Any]:
        return self.cache.get_many(keys)

    def set(self, key: str, value: Any, *, nx: bool = False, xx: bool = False) -> bool:
        return self.cache.set(key, value, None, nx=nx, xx=xx)

    def add(self, key: str, value: Any) -> bool:
        return self.cache.add(key, value, None)

    def delete(self, key: str) -> Any:
        return self.cache.delete(key)

    def delete_many(self, keys: Sequence[str]) -> Any:
        return self.cache.delete_many(keys)

    def set_many(self, mapping: Mapping[str, Any]) -> list[str]:
        return self.cache.set_many(mapping, None)

    def incr(self, key: str, delta: int) -> int:
        return self.cache.incr(key, delta)

    def touch(self, key: str) -> bool:
        return self.cache.touch(key, None)

    def get_or_set(self, key: str, value: Any, stampede: bool, seconds: float = 0.0) -> Any:
        default = computation(value, seconds) if stampede else value
        return self.cache.get_or_set(key, default, None)

    def close(self) -> None:
        self.cache.close()


ADAPTERS: dict[str, Callable[[Any, Mapping[str, Any]], Callable[[], Adapter]]] = {
    "core": CoreAdapter.build,
    "async": AsyncAdapter.build,
    "async-shared": SharedLoopAdapter.build,
    "django": DjangoAdapter.build,
}


# --------------------------------------------------------------------------- step hooks


@dataclass(frozen=True)
class StepHook:
    """A step inside the library, ``"module:Qualified.name"`` (a function or method), at which
    the first client to get there pauses until the nemesis armed on ``step`` has struck (or
    ``wait`` seconds passed). Installed in every client process by patching the attribute in
    that process only (never in shipped code)."""

    step: str
    target: str
    wait: float = 30.0


def _resolve(target: str) -> tuple[Any, str]:
    module_name, _, qualified = target.partition(":")
    owner: Any = importlib.import_module(module_name)
    *path, attr = qualified.split(".")
    for part in path:
        owner = getattr(owner, part)
    return owner, attr


def install_patches(patches: Sequence[tuple[str, str]]) -> None:
    """Replace each target by ``factory(original)`` in this process."""
    for target, factory_name in patches:
        owner, attr = _resolve(target)
        factory_owner, factory_attr = _resolve(factory_name)
        setattr(owner, attr, getattr(factory_owner, factory_attr)(getattr(owner, attr)))


def install_hooks(hooks: Sequence[StepHook], signals: Mapping[str, tuple[Any, Any]]) -> None:
    """Wrap each hook's target; ``signals[step]`` = (reached, released) events."""
    for hook in hooks:
        owner, attr = _resolve(hook.target)
        original = getattr(owner, attr)
        reached, released = signals[hook.step]
        gate = threading.Lock()

        def wrapped(
            *args: Any,
            _original: Any = original,
            _hook: StepHook = hook,
            _r: Any = reached,
            _x: Any = released,
            _gate: threading.Lock = gate,
            **kwargs: Any,
        ) -> Any:
            first = False
            with _gate:
                if not _r.is_set():
                    _r.set()
                    first = True
            if first:
                _x.wait(_hook.wait)
            return _original(*args, **kwargs)

        setattr(owner, attr, wrapped)


# --------------------------------------------------------------------------- the run


@dataclass
class Plan:
    """What the client processes do: ``processes`` x ``threads`` clients through ``adapter``
    with Django-style ``options``, drawing ops from ``weights`` (default: each OPS entry's)."""

    adapter: str
    sentinels: list[tuple[str, int]]
    options: dict[str, Any]
    workload: Workload
    seed: int
    processes: int = 2
    threads: int = 4
    pause: float = 0.002  # between a client's ops, so the servers get CPU too
    weights: dict[str, int] | None = None
    hooks: tuple[StepHook, ...] = ()
    #: (target, factory): in every client process, ``target`` ("module:Qualified.name") is
    #: replaced by ``factory(original)`` ("module:function"): the planted faults of the tests
    #: that prove the net can fail (never shipped code)
    patches: tuple[tuple[str, str], ...] = ()

    def ops_table(self) -> list[tuple[str, int]]:
        weights = self.weights or {name: spec.weight for name, spec in OPS.items()}
        return [(name, w) for name, w in weights.items() if w > 0]


@dataclass
class History:
    """Everything recorded: the ops of every client, the nemesis's events, the seed."""

    ops: list[Op]
    events: list[Event] = field(default_factory=list)
    seed: int = 0
    t0: float = 0.0
    workload: Workload | None = None

    def __repr__(self) -> str:
        return f"<History seed={self.seed} {len(self.ops)} ops {len(self.events)} events>"

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for op in self.ops:
            out[op.kind] = out.get(op.kind, 0) + 1
        return out


def _client_loop(
    plan: Plan,
    process: int,
    thread: int,
    adapter: Adapter,
    stop: Any,
    log: list[Op],
) -> None:
    client = f"p{process}t{thread}"
    rng = random.Random(f"{plan.seed}:{process}:{thread}")
    table = plan.ops_table()
    names = [n for n, _ in table]
    weights = [w for _, w in table]
    seq = 0

    def fresh() -> str:
        nonlocal seq
        seq += 1
        return f"{client}:{seq}"

    while not stop.is_set():
        name = rng.choices(names, weights)[0]
        keys, args = OPS[name].make(rng, plan.workload, fresh)
        log.append(_call(process, client, seq, name, keys, args, adapter))
        if plan.pause:
            time.sleep(plan.pause * rng.random() * 2)


def _call(
    process: int,
    client: str,
    seq: int,
    name: str,
    keys: tuple[str, ...],
    args: tuple[Any, ...],
    adapter: Adapter,
) -> Op:
    spec = OPS[name]
    invoke = time.monotonic()
    try:
        value = spec.result(spec.call(adapter, keys, args))
        kind, error = OK, ""
    except ValueError as exc:  # incr of a missing key: definite (Django's semantics)
        value, kind, error = None, FAIL, f"{type(exc).__name__}: {exc}"[:300]
    except Exception as exc:  # noqa: BLE001 - every failure is part of the history
        value, kind, error = None, INFO, f"{type(exc).__name__}: {exc}"[:300]
    return Op(process, client, seq, name, keys, args, invoke, time.monotonic(), kind, value, error)


def _process_main(plan: Plan, process: int, control: dict[str, Any], out: str) -> None:
    """One client process: build the adapter, report ready, run the clients between go and
    stop, then (process 0) read every key once the parent says the dust settled."""
    logs: list[list[Op]] = []
    errors: list[str] = []
    final: list[Op] = []
    try:
        install_patches(plan.patches)
        if plan.hooks:
            install_hooks(plan.hooks, control["hooks"])
        make = ADAPTERS[plan.adapter](plan.sentinels, plan.options)
        adapters = [make() for _ in range(plan.threads)]
        if process == 0:
            for key in plan.workload.counters:
                op = _call(process, "p0init", 0, "init_counter", (key,), (), adapters[0])
                final.append(op)
                if op.kind != OK or not op.value:
                    raise RuntimeError(f"could not create counter {key}: {op}")
        control["ready"][process].set()
        if not control["go"].wait(120):
            raise RuntimeError("never told to go")
        threads = []
        for n, adapter in enumerate(adapters):
            log: list[Op] = []
            logs.append(log)

            def run(n: int = n, adapter: Adapter = adapter, log: list[Op] = log) -> None:
                try:
                    _client_loop(plan, process, n, adapter, control["stop"], log)
                except BaseException:  # a recorder bug: reported to the parent
                    errors.append(f"client p{process}t{n}: {traceback.format_exc()}")

            thread = threading.Thread(target=run, name=f"history-p{process}t{n}", daemon=True)
            thread.start()
            threads.append(thread)
        control["stop"].wait()
        for thread in threads:
            thread.join(60)
            if thread.is_alive():
                errors.append(f"{thread.name} still running 60 s after stop")
        control["done"][process].set()
        if process == 0:
            if not control["final"].wait(180):
                raise RuntimeError("never told to read the final state")
            keys = (*plan.workload.keys, *plan.workload.counters)
            for n, key in enumerate(keys):
                final.append(_call(process, "final", n, "final_get", (key,), (), adapters[0]))
        for adapter in adapters:
            adapter.close()
    except BaseException:
        errors.append(f"process {process}: {traceback.format_exc()}")
    finally:
        with open(out, "wb") as f:
            pickle.dump(([op for log in logs for op in log] + final, errors), f)


class Recorder:
    """Runs a :class:`Plan`'s client processes (``spawn`` context); the parent drives the
    phases: :meth:`start` (every process ready, then go), :meth:`stop` (clients stop),
    :meth:`finish` (process 0 reads the final state; returns the :class:`History`)."""

    def __init__(self, plan: Plan, context: str = "spawn") -> None:
        self.plan = plan
        self.ctx = multiprocessing.get_context(context)
        self.dir = tempfile.mkdtemp(prefix="history-")
        self.control: dict[str, Any] = {
            "ready": [self.ctx.Event() for _ in range(plan.processes)],
            "done": [self.ctx.Event() for _ in range(plan.processes)],
            "go": self.ctx.Event(),
            "stop": self.ctx.Event(),
            "final": self.ctx.Event(),
            "hooks": {h.step: (self.ctx.Event(), self.ctx.Event()) for h in plan.hooks},
        }
        self.procs: list[Any] = []
        self.t0 = 0.0
        self.events: list[Event] = []

    def __repr__(self) -> str:
        return f"<Recorder {self.plan.adapter} {self.plan.processes}x{self.plan.threads} seed={self.plan.seed}>"

    def _out(self, n: int) -> str:
        return os.path.join(self.dir, f"p{n}.pickle")

    def start(self, timeout: float = 120.0) -> float:
        for n in range(self.plan.processes):
            proc = self.ctx.Process(
                target=_process_main,
                args=(self.plan, n, self.control, self._out(n)),
                name=f"history-p{n}",
                daemon=True,
            )
            proc.start()
            self.procs.append(proc)
        deadline = time.monotonic() + timeout
        for n, ready in enumerate(self.control["ready"]):
            while not ready.wait(0.2):
                if not self.procs[n].is_alive() or time.monotonic() > deadline:
                    self.abort()
                    raise AssertionError(
                        f"client process {n} not ready (exit code {self.procs[n].exitcode}): "
                        + "\n".join(self._errors())
                    )
        self.t0 = time.monotonic()
        self.control["go"].set()
        return self.t0

    def step(self, name: str) -> tuple[Any, Any]:
        """The (reached, released) events of a StepHook, for the nemesis to wait on and lift."""
        return self.control["hooks"][name]

    def stop(self, timeout: float = 90.0) -> None:
        self.control["stop"].set()
        for hook in self.control["hooks"].values():
            hook[1].set()  # no client stays paused
        deadline = time.monotonic() + timeout
        for n, done in enumerate(self.control["done"]):
            while not done.wait(0.2):
                if not self.procs[n].is_alive() or time.monotonic() > deadline:
                    break

    def _errors(self) -> list[str]:
        """What the client processes reported so far (their output files)."""
        errors: list[str] = []
        for n in range(self.plan.processes):
            try:
                with open(self._out(n), "rb") as f:
                    errors += pickle.load(f)[1]
            except (FileNotFoundError, EOFError, pickle.UnpicklingError):
                continue
        return errors

    def abort(self, timeout: float = 30.0) -> None:
        """Stop every client process now (the run failed): nothing is judged."""
        self.control["stop"].set()
        self.control["final"].set()
        for hook in self.control["hooks"].values():
            hook[1].set()
        for proc in self.procs:
            proc.join(timeout)
            if proc.is_alive():
                proc.kill()
                proc.join(10)

    def finish(self, timeout: float = 180.0) -> History:
        self.control["final"].set()
        for proc in self.procs:
            proc.join(timeout)
        alive = [p.name for p in self.procs if p.is_alive()]
        for proc in self.procs:
            if proc.is_alive():
                proc.kill()
                proc.join(10)
        ops: list[Op] = []
        errors: list[str] = list(f"{name} still running {timeout}s after finish" for name in alive)
        for n in range(self.plan.processes):
            try:
                with open(self._out(n), "rb") as f:
                    got, errs = pickle.load(f)
            except FileNotFoundError:
                errors.append(f"process {n} wrote no history (exit code {self.procs[n].exitcode})")
                continue
            ops += got
            errors += errs
        if errors:
            raise AssertionError("the recorder failed:\n" + "\n".join(errors))
        ops.sort(key=lambda op: op.invoke)
        return History(ops, list(self.events), self.plan.seed, self.t0, self.plan.workload)


def merge(ops: Iterable[Op]) -> list[Op]:
    """Ops in invocation order (hand-written histories)."""
    return sorted(ops, key=lambda op: op.invoke)
