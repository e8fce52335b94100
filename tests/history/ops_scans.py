"""Scan ops for the history recorder: ``iter_keys`` and ``delete_pattern`` over the run's
register keys (``<prefix>:k*``), registered into :data:`~history.recorder.OPS` on import.

* ``iter_keys`` emits one :class:`Scanned` per key of its pattern (the 12 registers and
  :data:`EXTRA_KEYS` more, written by ``set_extra``): returned or not. The checker's
  ``scan-missed`` rule judges the keys it did not return (a key present throughout the scan must
  come back); a key returned twice is fine (Redis's ``SCAN`` may repeat keys, and a shard's scan
  begins again from cursor 0 on a new master: the duplicates are counted, not judged).
* ``delete_pattern`` is a delete of every register key (a ``Delete`` effect each, certain when
  it returned), so the register model judges it as any delete: once it completed, a value
  written before it began is gone (``delete-undone``, ``lost-write``), while a key written
  during it may or may not survive.

``SCAN_COUNT`` is 2, so a shard's scan of the ~6 keys it holds takes several ``SCAN`` steps
and a fault can land between them (``StepHook`` on ``ShardScan.take``).

The client processes import this module through :data:`REGISTER` (a no-op patch: the recorder
imports a patch's module in every client process before drawing ops).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .recorder import (
    INFO,
    OK,
    OPS,
    Adapter,
    AsyncAdapter,
    CoreAdapter,
    Delete,
    DjangoAdapter,
    Effect,
    Op,
    OpSpec,
    Workload,
    Write,
)

SCAN_COUNT = 2
#: A scan begun this long after the client process's first scan reply is the first that may pause at
#: the mid-scan step: by then the run's keys exist (a scan at the very start finds none).
WARM_UP = 0.5


@dataclass(frozen=True)
class Scanned:
    """An iter_keys over the key's pattern returned it (``returned``) or not; ``times``: how
    often it came back."""

    key: str
    returned: bool
    times: int = 0


def prefix_of(workload_key: str) -> str:
    """``<prefix>:k3`` -> ``<prefix>``."""
    return workload_key.rsplit(":", 1)[0]


async def _collect(iterator: Any) -> list[Any]:
    return [key async for key in iterator]


def iter_keys(adapter: Adapter, pattern: str) -> list[str]:
    """Every key matching ``pattern`` (a glob on the caller's key names), through the adapter's
    public API, duplicates kept."""
    if isinstance(adapter, DjangoAdapter):
        return list(adapter.cache.iter_keys(pattern, itersize=SCAN_COUNT))
    if isinstance(adapter, CoreAdapter):
        return [k.decode() for k in adapter.client.iter_keys(pattern, count=SCAN_COUNT)]
    if isinstance(adapter, AsyncAdapter):
        got = adapter._run(_collect(adapter.client.iter_keys(pattern, count=SCAN_COUNT)))
        return [k.decode() for k in got]
    raise TypeError(f"no iter_keys for {adapter!r}")


def delete_pattern(adapter: Adapter, pattern: str) -> int:
    if isinstance(adapter, DjangoAdapter):
        return int(adapter.cache.delete_pattern(pattern, itersize=SCAN_COUNT))
    if isinstance(adapter, CoreAdapter):
        return int(adapter.client.delete_pattern(pattern, count=SCAN_COUNT))
    if isinstance(adapter, AsyncAdapter):
        return int(adapter._run(adapter.client.delete_pattern(pattern, count=SCAN_COUNT)))
    raise TypeError(f"no delete_pattern for {adapter!r}")


#: Keys of the scans' pattern beyond the run's 12 registers (``<prefix>:kx<n>``, written by
#: ``set_extra`` only): about 24 on a shard instead of 6, so a scan that goes wrong on one
#: shard misses one of them almost surely, not in 4 runs of 5.
EXTRA_KEYS = 36


def extra_keys(w: Workload) -> tuple[str, ...]:
    return tuple(f"{prefix_of(w.keys[0])}:kx{n}" for n in range(EXTRA_KEYS))


def _every_key(rng: random.Random, w: Workload, value: Callable[[], str]) -> Any:
    return (*w.keys, *extra_keys(w)), ()


def _extra_value(rng: random.Random, w: Workload, value: Callable[[], str]) -> Any:
    return (rng.choice(extra_keys(w)),), (value(),)


def _extra_written(op: Op) -> list[Any]:
    if op.kind == OK:
        return [Write(op.keys[0], op.args[0], True)] if op.value else []
    return [Write(op.keys[0], op.args[0], False)] if op.kind == INFO else []


def _pattern(keys: tuple[str, ...]) -> str:
    return f"{prefix_of(keys[0])}:k*"


def _scanned(op: Op) -> list[Any]:
    if op.kind != OK:
        return []
    got = list(op.value)
    return [Scanned(k, k in got, got.count(k)) for k in op.keys]


def _pattern_deleted(op: Op) -> list[Effect]:
    if op.kind not in (OK, INFO):
        return []
    return [Delete(k, op.kind == OK) for k in op.keys]


SCAN_OPS: dict[str, OpSpec] = {
    "set_extra": OpSpec(_extra_value, lambda a, k, x: a.set(k[0], x[0]), _extra_written, weight=0),
    "iter_keys": OpSpec(
        _every_key, lambda a, k, x: iter_keys(a, _pattern(k)), _scanned, result=list, weight=0
    ),
    "delete_pattern": OpSpec(
        _every_key, lambda a, k, x: delete_pattern(a, _pattern(k)), _pattern_deleted, weight=0
    ),
}
OPS.update(SCAN_OPS)

#: Scenario.patches entry importing this module in the client processes (changes nothing).
registered = True
REGISTER = ("history.ops_scans:registered", "history.ops_scans:unchanged")


def unchanged(original: Any) -> Any:
    """The no-op patch factory of :data:`REGISTER`."""
    return original


def duplicates(ops: list[Op]) -> int:
    """How many keys the scans returned more than once (a figure, never a violation)."""
    return sum(
        1
        for op in ops
        for e in (_scanned(op) if op.name == "iter_keys" else [])
        if isinstance(e, Scanned) and e.times > 1
    )


def scan_never_restarts(original: Any) -> Any:
    """Planted fault for ``ShardScan.command``: after a master switch the scan goes on with its
    old cursor on the new master (the generation adopted, the cursor kept), as a scan that does
    not know a cursor is one server's would."""

    def command(self: Any) -> Any:
        self.generation = self.shard.generation
        head = ("SCAN",) if self.key is None else ("SSCAN", self.key)
        return (*head, self.cursor, "MATCH", self.match, "COUNT", self.count)

    return command


def mid_scan() -> None:
    """The step a ``StepHook`` names to land a fault in the middle of a shard's scan: called by
    :func:`with_mid_scan_step`'s ``take`` once a ``SCAN`` reply took the cursor past half of
    the server's table. Does nothing itself."""


def with_mid_scan_step(original: Any) -> Any:
    """Instrumentation (no change of behaviour) for ``ShardScan.take``: after a reply, call
    :func:`mid_scan` the first time the scan is past half the table. A ``SCAN`` cursor counts
    buckets in reversed-bit order, so its lowest bit set means half of the buckets are behind
    it: a fault landing there leaves about half the keys ahead of a cursor that, on another
    server, points somewhere else."""

    returned: dict[int, tuple[float, int]] = {}  # id(scan) -> (first reply, keys so far)
    armed: list[float] = []  # the first reply's time + WARM_UP: the run's keys written by then

    def take(self: Any, reply: Any) -> list[Any]:
        keys = original(self, reply)
        now = time.monotonic()
        if not armed:
            armed.append(now + WARM_UP)
        began, seen = returned.get(id(self), (now, 0))
        returned[id(self)] = (began, seen + len(keys))
        if self.done:
            returned.pop(id(self), None)
        elif self.shard.index == 0 and self.cursor & 1 and began > armed[0]:
            # the nemeses' target (MASTERS[0]), past half of its table
            mid_scan()  # looked up at call time: the hook wraps the module's attribute
        return keys

    return take


#: Scenario.patches entry that makes the "mid-scan" StepHook reachable.
MID_SCAN = ("sentinel_cache.core.ops.scan:ShardScan.take", "history.ops_scans:with_mid_scan_step")
MID_SCAN_HOOK = "history.ops_scans:mid_scan"
