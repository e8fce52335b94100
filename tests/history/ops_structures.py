"""The django-redis API as history ops (issue 35, phase 2a): sets (with the multi-key
operations and ``smove`` across shards), hashes, sorted sets and ``lock``, called through the
Django backend (``django.core.cache.caches``, the ``"django"`` adapter), where users call them.

Each structure maps onto the checker's register and counter models: a set member's presence is
a register (``set|member``: the member while present, None when absent; every member is fresh
and moved at most once, so a read names the write it saw), a hash field and a sorted-set
member's score are registers of unique values, ``zincrby`` a counter. Locks are judged by the
checker's ``lock-exclusive`` model from the holds each ``lock`` op records.

Importing this module registers the ops in :data:`~history.recorder.OPS` (weight 0: drawn only
by the scenarios that name them). The member pools live in each client process (its threads
share them), so threads of one process remove, move and read each other's members.
"""

from __future__ import annotations

import random
import re
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from .checker import member_key
from .recorder import INFO, OK, OPS, Delete, Incr, Op, OpSpec, Read, Workload, Write

Fresh = Callable[[], str]

SETS, HASHES, ZSETS, LOCKS = 4, 2, 2, 2
FIELDS = ("f0", "f1", "f2")
ZMEMBERS = ("m0", "m1", "m2")
ZCOUNTER = "zc"

_pool_lock = threading.Lock()
#: set key -> members added there and neither removed nor moved (this process's)
_present: dict[str, list[str]] = defaultdict(list)
#: (set key, member) pairs worth reading (every set a member was added or moved to)
_known: list[tuple[str, str]] = []


def prefix(w: Workload) -> str:
    return w.keys[0].rsplit(":", 1)[0]


def set_keys(w: Workload) -> list[str]:
    return [f"{prefix(w)}:s{i}" for i in range(SETS)]


# ------------------------------------------------------------------------------- sets


def _sadd(rng: random.Random, w: Workload, fresh: Fresh) -> tuple[tuple[str, ...], tuple[Any, ...]]:
    key, member = rng.choice(set_keys(w)), fresh()
    with _pool_lock:
        _present[key].append(member)
        _known.append((key, member))
    return (key,), (member,)


def _take(rng: random.Random, w: Workload) -> tuple[str, str] | None:
    """A member believed present somewhere, taken out of the pool (removed or moved next)."""
    with _pool_lock:
        keys = [k for k in set_keys(w) if _present[k]]
        if not keys:
            return None
        key = rng.choice(keys)
        members = _present[key]
        return key, members.pop(rng.randrange(len(members)))


def _srem(rng: random.Random, w: Workload, fresh: Fresh) -> tuple[tuple[str, ...], tuple[Any, ...]]:
    taken = _take(rng, w)
    if taken is None:
        return (rng.choice(set_keys(w)),), (fresh(),)
    return (taken[0],), (taken[1],)


def _smove(
    rng: random.Random, w: Workload, fresh: Fresh
) -> tuple[tuple[str, ...], tuple[Any, ...]]:
    taken = _take(rng, w)
    keys = set_keys(w)
    if taken is None:
        src, dst = rng.sample(keys, 2)
        return (src, dst), (fresh(),)
    src, member = taken
    dst = rng.choice([k for k in keys if k != src])
    with _pool_lock:
        _known.append((dst, member))  # never moved again: each (set, member) written once
    return (src, dst), (member,)


def _sismember(
    rng: random.Random, w: Workload, fresh: Fresh
) -> tuple[tuple[str, ...], tuple[Any, ...]]:
    with _pool_lock:
        if _known:
            key, member = _known[-rng.randrange(1, min(len(_known), 40) + 1)]
            return (key,), (member,)
    return (rng.choice(set_keys(w)),), (fresh(),)


def _set_one(
    rng: random.Random, w: Workload, fresh: Fresh
) -> tuple[tuple[str, ...], tuple[Any, ...]]:
    return (rng.choice(set_keys(w)),), ()


def _set_two(
    rng: random.Random, w: Workload, fresh: Fresh
) -> tuple[tuple[str, ...], tuple[Any, ...]]:
    return tuple(rng.sample(set_keys(w), 2)), ()


def _add_effects(op: Op) -> list[Any]:
    if op.kind not in (OK, INFO):
        return []
    return [Write(member_key(op.keys[0], op.args[0]), op.args[0], op.kind == OK)]


def _rem_effects(op: Op) -> list[Any]:
    if op.kind not in (OK, INFO):
        return []
    return [Delete(member_key(op.keys[0], op.args[0]), op.kind == OK)]


def _move_effects(op: Op) -> list[Any]:
    """Moved: gone from the source, in the destination; False: it was not in the source
    (a read); raised: either, at any time from its invocation on."""
    (src, dst), (member,) = op.keys, op.args
    if op.kind == OK and not op.value:
        return [Read(member_key(src, member), None)]
    if op.kind not in (OK, INFO):
        return []
    certain = op.kind == OK
    return [
        Delete(member_key(src, member), certain),
        Write(member_key(dst, member), member, certain),
    ]


def _ismember_effects(op: Op) -> list[Any]:
    if op.kind != OK:
        return []
    member = op.args[0]
    return [Read(member_key(op.keys[0], member), member if op.value else None)]


def _members_in(*which: int) -> Callable[[Op], list[Any]]:
    """A read of whole sets: each returned member is present in the sets ``which`` (indexes
    into the op's keys) as of the read (smembers: the one key; sdiff: the first; sinter: all)."""

    def effects(op: Op) -> list[Any]:
        if op.kind != OK:
            return []
        return [Read(member_key(op.keys[i], m), m) for m in op.value for i in which]

    return effects


def _members(result: Any) -> list[str]:
    return sorted(str(m) for m in result)


# ------------------------------------------------------------------------------- hashes


def _hash_field(
    rng: random.Random, w: Workload, fresh: Fresh
) -> tuple[tuple[str, ...], tuple[Any, ...]]:
    return (f"{prefix(w)}:h{rng.randrange(HASHES)}",), (rng.choice(FIELDS),)


def _hset(rng: random.Random, w: Workload, fresh: Fresh) -> tuple[tuple[str, ...], tuple[Any, ...]]:
    keys, (field,) = _hash_field(rng, w, fresh)
    return keys, (field, fresh())


def _hset_effects(op: Op) -> list[Any]:
    if op.kind not in (OK, INFO):
        return []
    field, value = op.args
    return [Write(member_key(op.keys[0], field), value, op.kind == OK)]


def _hdel_effects(op: Op) -> list[Any]:
    if op.kind not in (OK, INFO):
        return []
    return [Delete(member_key(op.keys[0], op.args[0]), op.kind == OK)]


def _hget_effects(op: Op) -> list[Any]:
    return [Read(member_key(op.keys[0], op.args[0]), op.value)] if op.kind == OK else []


def _hgetall_effects(op: Op) -> list[Any]:
    if op.kind != OK:
        return []
    return [Read(member_key(op.keys[0], f), op.value.get(f)) for f in FIELDS]


# ------------------------------------------------------------------------------- sorted sets


def score(value: str) -> float:
    """A unique score from a fresh value ``p<process>t<thread>:<n>``."""
    client, n = value.split(":")
    p, t = client[1:].split("t")
    return float(int(p) * 10**8 + int(t) * 10**6 + int(n))


def _zmember(
    rng: random.Random, w: Workload, fresh: Fresh
) -> tuple[tuple[str, ...], tuple[Any, ...]]:
    return (f"{prefix(w)}:z{rng.randrange(ZSETS)}",), (rng.choice(ZMEMBERS),)


def _zadd(rng: random.Random, w: Workload, fresh: Fresh) -> tuple[tuple[str, ...], tuple[Any, ...]]:
    keys, (member,) = _zmember(rng, w, fresh)
    return keys, (member, score(fresh()))


def _zincr(
    rng: random.Random, w: Workload, fresh: Fresh
) -> tuple[tuple[str, ...], tuple[Any, ...]]:
    return (f"{prefix(w)}:z{rng.randrange(ZSETS)}",), (rng.randint(1, 5),)


def _zincr_effects(op: Op) -> list[Any]:
    key = member_key(op.keys[0], ZCOUNTER)
    if op.kind == OK:
        return [Incr(key, op.args[0], True, int(op.value))]
    return [Incr(key, op.args[0], False)] if op.kind == INFO else []


# ------------------------------------------------------------------------------- locks

LOCK_TIMEOUT = 2.0  # s: far longer than a hold, so expiry never relaxes the rule here


def _lock_args(hold: tuple[float, float], timeout: float) -> Callable[..., Any]:
    def make(
        rng: random.Random, w: Workload, fresh: Fresh
    ) -> tuple[tuple[str, ...], tuple[Any, ...]]:
        return (f"{prefix(w)}:lock{rng.randrange(LOCKS)}",), (rng.uniform(*hold), timeout)

    return make


def hold_lock(cache: Any, name: str, hold: float, timeout: float) -> dict[str, Any]:
    """Acquire (blocking, polling every 5 ms, up to 1 s), hold ``hold`` seconds, release; the
    times the checker judges: ``begin`` (acquire called), ``held`` (acquire returned True),
    ``released`` (release called). A failed release is recorded, not raised: the hold happened."""
    lock = cache.lock(name, timeout=timeout, sleep=0.005, blocking_timeout=1.0)
    begin = time.monotonic()
    acquired = lock.acquire()
    held = time.monotonic()
    out: dict[str, Any] = {"acquired": acquired, "begin": begin, "held": held, "timeout": timeout}
    if not acquired:
        return out
    token = lock.local.token
    text = token.decode(errors="replace") if isinstance(token, bytes) else str(token)
    found = re.search(r"[0-9a-f]{32}", text)  # the uuid inside the codec's framing
    out["token"] = found.group(0) if found else text
    time.sleep(hold)
    out["released"] = time.monotonic()
    try:
        lock.release()
    except Exception as exc:  # noqa: BLE001 - recorded: an expired lock's release is refused
        out["release_error"] = f"{type(exc).__name__}: {exc}"[:200]
    return out


def unsafe_release(original: Callable[..., Any]) -> Callable[..., Any]:
    """Planted fault: ``CacheLock.do_release`` that deletes the lock without comparing its
    token, so a holder whose lock expired deletes the next holder's."""

    def do_release(self: Any, expected_token: Any) -> None:
        self.client.execute(self.shard, [("DEL", self.name)], write=True, idempotent=True)

    return do_release


# ------------------------------------------------------------------------------- the table


def _c(method: str) -> Callable[[Any, tuple[str, ...], tuple[Any, ...]], Any]:
    """A call of ``cache.<method>(*keys, *args)`` on the Django adapter's cache."""
    return lambda a, k, x: getattr(a.cache, method)(*k, *x)


STRUCTURE_OPS: dict[str, OpSpec] = {
    "sadd": OpSpec(_sadd, _c("sadd"), _add_effects, weight=0),
    "srem": OpSpec(_srem, _c("srem"), _rem_effects, weight=0),
    "smove": OpSpec(_smove, _c("smove"), _move_effects, result=bool, weight=0),
    "sismember": OpSpec(_sismember, _c("sismember"), _ismember_effects, result=bool, weight=0),
    "smembers": OpSpec(_set_one, _c("smembers"), _members_in(0), result=_members, weight=0),
    "sdiff": OpSpec(_set_two, _c("sdiff"), _members_in(0), result=_members, weight=0),
    "sinter": OpSpec(_set_two, _c("sinter"), _members_in(0, 1), result=_members, weight=0),
    "sunion": OpSpec(_set_two, _c("sunion"), lambda op: [], result=_members, weight=0),
    "hset": OpSpec(_hset, _c("hset"), _hset_effects, weight=0),
    "hdel": OpSpec(_hash_field, _c("hdel"), _hdel_effects, weight=0),
    "hget": OpSpec(_hash_field, _c("hget"), _hget_effects, weight=0),
    "hgetall": OpSpec(
        _hash_field, lambda a, k, x: a.cache.hgetall(k[0]), _hgetall_effects, result=dict, weight=0
    ),
    "zadd": OpSpec(
        _zadd, lambda a, k, x: a.cache.zadd(k[0], {x[0]: x[1]}), _hset_effects, weight=0
    ),
    "zrem": OpSpec(_zmember, _c("zrem"), _hdel_effects, weight=0),
    "zscore": OpSpec(_zmember, _c("zscore"), _hget_effects, weight=0),
    "zincrby": OpSpec(
        _zincr, lambda a, k, x: a.cache.zincrby(k[0], x[0], ZCOUNTER), _zincr_effects, weight=0
    ),
    "lock": OpSpec(
        _lock_args((0.005, 0.02), LOCK_TIMEOUT),
        lambda a, k, x: hold_lock(a.cache, k[0], *x),
        lambda op: [],
        weight=0,
    ),
    # holds that sometimes outlast a short timeout: expiry hands the lock on mid-hold, and
    # only a release that compares its token leaves the next holder's lock alone
    "lock_expiring": OpSpec(
        _lock_args((0.02, 0.12), 0.06),
        lambda a, k, x: hold_lock(a.cache, k[0], *x),
        lambda op: [],
        weight=0,
    ),
}


def shaped(specs: dict[str, OpSpec], arity: dict[str, tuple[int, int]]) -> dict[str, OpSpec]:
    """``specs`` whose effects ignore an op without the (keys, args) its ``make`` always gives
    (a hand-written sample: phase 1's test_every_op_states_its_effects)."""

    def guard(
        effects: Callable[[Op], list[Any]], keys: int, args: int
    ) -> Callable[[Op], list[Any]]:
        return lambda op: effects(op) if len(op.keys) >= keys and len(op.args) >= args else []

    return {
        name: replace(spec, effects=guard(spec.effects, *arity.get(name, (0, 0))))
        for name, spec in specs.items()
    }


STRUCTURE_OPS = shaped(
    STRUCTURE_OPS,
    {"sadd": (1, 1), "srem": (1, 1), "smove": (2, 1), "sismember": (1, 1), "smembers": (1, 0),
     "sdiff": (1, 0), "sinter": (2, 0), "hset": (1, 2), "hdel": (1, 1), "hget": (1, 1),
     "hgetall": (1, 0), "zadd": (1, 2), "zrem": (1, 1), "zscore": (1, 1), "zincrby": (1, 1)},
)  # fmt: skip
OPS.update(STRUCTURE_OPS)


def same(original: Any) -> Any:
    """A patch that changes nothing: naming this module in a scenario's ``patches`` imports it
    in the client processes, which registers its ops there (see :data:`REGISTER`)."""
    return original


#: ``Scenario.patches`` entries that register this module's and ops_sessions' ops in the client
#: processes (spawned: they import only what the plan names)
REGISTER = (
    ("history.ops_structures:STRUCTURE_OPS", "history.ops_structures:same"),
    ("history.ops_sessions:SESSION_OPS", "history.ops_structures:same"),
)


def smove_without_add(original: Callable[..., Any]) -> Callable[..., Any]:
    """Planted fault: ``smove`` across shards that removes the member from the source and
    answers True without adding it to the destination (its second step dropped)."""

    def smove(self: Any, source: Any, destination: Any, member: Any) -> bool:
        if self.one_shard([source, destination]) is not None:
            return bool(original(self, source, destination, member))
        return bool(self.srem(source, member))

    return smove
