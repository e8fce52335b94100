"""The checker: judges a recorded :class:`~history.recorder.History` against the rules a cache
must keep, stated once in :data:`RULES`, and reports each violation with the operations involved
(an Elle-style anomaly: the write, the op that overwrote or deleted it, the read), so a failure
reads as a bug report.

Soundness with indeterminate ops: an op that raised (``info``) may have taken effect at any time
from its invocation on, even long after it raised (a request held by a partition is delivered on
heal); it is never trusted to have happened, and always allowed to have. An acknowledged op took
effect somewhere in [invoke, complete]. Conditional writes that returned False changed nothing.

Relaxations are parameters (:class:`Modes`), not special cases: a read may lag by
``Modes.lag`` seconds (replica reads under OUTAGE_READS with the bound docs/failover.md states,
the near cache's delivery bound), optionally only inside given windows.
"""

from __future__ import annotations

import bisect
import itertools
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .nemeses import FAILOVER_ABORTED, KILL_SENT
from .recorder import (
    INFO,
    OK,
    CounterMissing,
    Delete,
    Effect,
    Event,
    History,
    Incr,
    Op,
    Read,
    Stored,
    Write,
    effects,
)

#: rule name -> (what it says, which mode or option relaxes it)
RULES: dict[str, tuple[str, str]] = {
    "lost-write": (
        "the final read (after the dust settled) sees an acknowledged write, or a value written "
        "after it: it never misses it with nothing that could have deleted it, and never sees a "
        "value the acknowledged write had overwritten",
        "none",
    ),
    "stale-read": (
        "a read never returns a value v (written by W) when an acknowledged overwrite X began "
        "after W completed and completed before the read began; a read never misses when an "
        "acknowledged write completed before it began and no delete (acknowledged or not) "
        "could have run in between",
        "Modes.lag: replica reads (READ_FROM_REPLICAS, OUTAGE_READS) and the near cache "
        "(NEAR_CACHE) within their stated bound; always: get_or_set callers of one process "
        "that joined another's flight read as of that flight's start (they share one read, "
        "docs/stampede.md)",
    ),
    "delete-undone": (
        "a read never returns a value whose write completed before an acknowledged delete "
        "began, once that delete completed",
        "Modes.lag, as stale-read",
    ),
    "phantom": (
        "a read returns only values some op tried to write to that key, and never one whose "
        "write began after the read completed",
        "none",
    ),
    "counter": (
        "a counter's final value is its acknowledged increments plus some subset of the "
        "indeterminate ones; every value incr returns lies within the bounds of the increments "
        "that may have happened by then; a counter created before the run is never missing",
        "none",
    ),
    "get-or-set-stored": (
        "once get_or_set returned v, later reads see v until something (acknowledged or "
        "not) that could overwrite or delete the key ran",
        "Modes.lag, as stale-read",
    ),
    # ---- phase 2a (issue 35): availability, locks, set moves; models in the block at the end
    "unavailable": (
        "under a nemesis that promises the cache stays available (AVAILABLE_UNDER: CLIENT KILL "
        "on a healthy master, a planned failover within FAILOVER_HOLD, no fault), no "
        "operation raises",
        "a nemesis not in AVAILABLE_UNDER (a crash, a partition); a scenario leaves the rule "
        "out of its rules where its options allow errors",
    ),
    "lock-exclusive": (
        "at most one lock holder at a time: two holders' intervals (acquire completed, "
        "release begun) never overlap",
        "the lock's timeout: a hold is certain only until timeout after its acquire began",
    ),
    "smove-lost": (
        "a member smove tried to move is afterwards in its source or its destination, never "
        "in neither (unless something removed it)",
        "none",
    ),
}


@dataclass(frozen=True)
class Modes:
    """What the scenario's options allow: reads may lag the last write by up to ``lag`` seconds
    (inside ``windows`` only, if given: (start, end) monotonic times); a read overlapping one
    of the ``misses`` windows may miss a present key (fail-open: ``IGNORE_EXCEPTIONS`` answers
    a miss for what an unavailable server holds), never return a value it should not."""

    lag: float = 0.0
    windows: tuple[tuple[float, float], ...] | None = None
    why: str = ""
    misses: tuple[tuple[float, float], ...] = ()

    def allowed(self, read: Op) -> float:
        if self.windows is None:
            return self.lag
        inside = any(s <= read.complete and read.invoke <= e for s, e in self.windows)
        return self.lag if inside else 0.0

    def may_miss(self, read: Op) -> bool:
        return any(s <= read.complete and read.invoke <= e for s, e in self.misses)


STRICT = Modes()


@dataclass
class Violation:
    rule: str
    key: str
    message: str
    ops: list[tuple[str, Op]]  # (role, op)

    def report(self, t0: float = 0.0, events: Sequence[Event] = ()) -> str:
        lines = [f"{self.rule} on {self.key}: {self.message}"]
        lines += [f"    {role:<3} {op.describe(t0)}" for role, op in self.ops]
        span = [op.invoke for _, op in self.ops] + [op.complete for _, op in self.ops]
        for event in events:
            if event.name == "none":
                continue
            if span and event.start <= max(span) + 1 and event.end >= min(span) - 1:
                lines.append(
                    f"    nemesis {event.name} [{event.start - t0:.4f}, {event.end - t0:.4f}] "
                    f"{event.detail}"
                )
        return "\n".join(lines)


@dataclass
class Verdict:
    """The judged history: the violations and the figures."""

    history: History
    violations: list[Violation] = field(default_factory=list)
    figures: dict[str, int] = field(default_factory=dict)

    def __repr__(self) -> str:
        return f"<Verdict {len(self.violations)} violations {self.figures}>"

    def by_rule(self) -> dict[str, int]:
        out: dict[str, int] = defaultdict(int)
        for v in self.violations:
            out[v.rule] += 1
        return dict(out)

    def report(self, limit: int = 10) -> str:
        h = self.history
        head = f"seed {h.seed}: {self.figures}; violations {self.by_rule() or 0}" + "".join(
            f"\n  nemesis {e.name} [{e.start - h.t0:.3f}, {e.end - h.t0:.3f}] {e.detail}"
            for e in h.events
        )
        errors: dict[str, int] = defaultdict(int)
        for op in h.ops:
            if op.error:
                errors[f"{op.name}: {op.error[:120]}"] += 1
        if errors:
            head += "\n  errors: " + "; ".join(
                f"{n} x {e}" for e, n in sorted(errors.items(), key=lambda i: -i[1])[:8]
            )
        shown = [v.report(h.t0, h.events) for v in self.violations[:limit]]
        more = len(self.violations) - len(shown)
        return "\n".join([head, *shown] + ([f"... {more} more"] if more > 0 else []))


@dataclass
class _Key:
    """One register key's ops, by effect."""

    writes: list[tuple[Op, Write]] = field(default_factory=list)
    deletes: list[tuple[Op, Delete]] = field(default_factory=list)
    reads: list[tuple[Op, Read]] = field(default_factory=list)
    stored: list[tuple[Op, Stored]] = field(default_factory=list)


class _Latest:
    """Among ops sorted by completion, the one with the latest invocation that completed
    before a time: "was there an acknowledged X that began after t and ended before u?"."""

    def __init__(self, ops: Iterable[Op]) -> None:
        ordered = sorted(ops, key=lambda op: op.complete)
        self.ends = [op.complete for op in ordered]
        self.best: list[Op] = []
        for op in ordered:
            if not self.best or op.invoke > self.best[-1].invoke:
                self.best.append(op)
            else:
                self.best.append(self.best[-1])

    def before(self, t: float) -> Op | None:
        """The latest-invoked op that completed strictly before ``t``."""
        i = bisect.bisect_left(self.ends, t)
        return self.best[i - 1] if i else None


def check(history: History, modes: Modes = STRICT, rules: Iterable[str] | None = None) -> Verdict:
    """Judge ``history`` (only ``rules`` if given; unknown names are an error)."""
    wanted = set(RULES if rules is None else rules)
    unknown = wanted - set(RULES)
    if unknown:
        raise ValueError(f"unknown rules {sorted(unknown)}; the rules are {sorted(RULES)}")
    verdict = Verdict(history)
    registers: dict[str, _Key] = defaultdict(_Key)
    counters: dict[str, list[tuple[Op, Effect]]] = defaultdict(list)
    counter_keys: set[str] = set()
    for op in history.ops:
        for effect in effects(op):
            if isinstance(effect, (Incr, CounterMissing)):
                counter_keys.add(effect.key)
    for op in history.ops:
        for effect in effects(op):
            if effect.key in counter_keys:
                counters[effect.key].append((op, effect))
            elif isinstance(effect, Write):
                registers[effect.key].writes.append((op, effect))
            elif isinstance(effect, Delete):
                registers[effect.key].deletes.append((op, effect))
            elif isinstance(effect, Read):
                registers[effect.key].reads.append((op, effect))
            elif isinstance(effect, Stored):
                registers[effect.key].stored.append((op, effect))
    found: list[Violation] = []
    for key, ops in sorted(registers.items()):
        found += _register(key, ops, modes)
    for key, ops in sorted(counters.items()):
        found += _counter(key, ops)
    for model in (*EXTRA_MODELS, *MODELS):  # the phase-2 models (their blocks at the end)
        found += model(history, modes)
    verdict.violations = [v for v in found if v.rule in wanted]
    kinds = history.counts()
    verdict.figures = {
        "ops": len(history.ops),
        "ok": kinds.get(OK, 0),
        "info": kinds.get(INFO, 0),
        "fail": kinds.get("fail", 0),
        "reads": sum(len(k.reads) for k in registers.values()),
        "acked writes": sum(1 for k in registers.values() for _, w in k.writes if w.certain),
        "acked deletes": sum(1 for k in registers.values() for _, d in k.deletes if d.certain),
    }
    return verdict


def _register(key: str, ops: _Key, modes: Modes) -> list[Violation]:
    out: list[Violation] = []
    writer: dict[Any, tuple[Op, Write]] = {}
    for op, w in ops.writes:
        writer.setdefault(w.value, (op, w))
    acked_writes = [op for op, w in ops.writes if w.certain]
    acked_changes = _Latest(acked_writes + [op for op, d in ops.deletes if d.certain])
    latest_write = _Latest(acked_writes)
    # deleters by invocation, each with the latest time it may have taken effect
    # (acknowledged: its completion; indeterminate: any time from its invocation on)
    deleters = sorted(
        ((op, op.complete if d.certain else float("inf")) for op, d in ops.deletes),
        key=lambda pair: pair[0].invoke,
    )
    del_invokes = [op.invoke for op, _ in deleters]

    def deleted_between(after: float, before: float) -> Op | None:
        """A delete that may have taken effect after ``after`` and before ``before``."""
        for op, latest in deleters[: bisect.bisect_left(del_invokes, before)]:
            if latest > after:
                return op
        return None

    flights = _flight_starts(ops)
    for read, r in ops.reads:
        lag = modes.allowed(read)
        begin = flights.get(id(read), read.invoke)
        if r.value is None:
            if modes.may_miss(read):
                continue
            w_op = latest_write.before(begin - lag)
            if w_op is not None and deleted_between(w_op.invoke, read.complete) is None:
                rule = "lost-write" if r.final else "stale-read"
                out.append(
                    Violation(
                        rule,
                        key,
                        "the read missed, though an acknowledged write completed before it began "
                        "and nothing could have deleted the key since",
                        [("W", w_op), ("R", read)],
                    )
                )
            continue
        source = writer.get(r.value)
        if source is None:
            out.append(
                Violation(
                    "phantom",
                    key,
                    f"the read returned {r.value!r}, which no op wrote here",
                    [("R", read)],
                )
            )
            continue
        w_op, w = source
        if w_op.invoke > read.complete:
            out.append(
                Violation(
                    "phantom",
                    key,
                    "the read returned a value whose write began after it ended",
                    [("W", w_op), ("R", read)],
                )
            )
            continue
        if not w.certain:
            continue  # an indeterminate write may land at any time: nothing is stale after it
        x = acked_changes.before(begin - lag)
        if x is not None and x.invoke > w_op.complete:
            deleting = any(o is x for o, _ in ops.deletes)
            rule = "lost-write" if r.final else "delete-undone" if deleting else "stale-read"
            what = "deleted" if deleting else "overwrote"
            out.append(
                Violation(
                    rule,
                    key,
                    f"the read returned W's value, but X {what} it (acknowledged) after W "
                    "completed and before the read began",
                    [("W", w_op), ("X", x), ("R", read)],
                )
            )
    out += _stored(key, ops, modes)
    return out


#: get_or_set with a callable default: one flight per key and process (the core's and the
#: asyncio client's; Django's without STAMPEDE_PROTECTION has none, and is judged as if it did)
FLIGHT_OPS = ("get_or_set", "get_or_set_slow")


def _flight_starts(ops: _Key) -> dict[int, float]:
    """When each get_or_set read may have been taken: the threads of one process that call it
    on a key at once share one read (docs/stampede.md, "One computation per miss"), so a
    caller that joined a flight reads as of the earliest call of its process on that key still
    running when it began. id(op) -> that time, for the ops where it is earlier."""
    calls: dict[int, list[Op]] = defaultdict(list)
    for op, _ in ops.reads:
        if op.name in FLIGHT_OPS:
            calls[op.process].append(op)
    for op, _ in ops.writes:  # the ones that stored their own value were in flights too
        if op.name in FLIGHT_OPS:
            calls[op.process].append(op)
    starts: dict[int, float] = {}
    for group in calls.values():
        unique = {id(op): op for op in group}.values()
        for op in unique:
            earliest = min(
                (o.invoke for o in unique if o.invoke <= op.invoke <= o.complete),
                default=op.invoke,
            )
            if earliest < op.invoke:
                starts[id(op)] = earliest
    return starts


def _stored(key: str, ops: _Key, modes: Modes) -> list[Violation]:
    """get-or-set-stored: after get_or_set returned v, reads before any possible change see v."""
    out: list[Violation] = []
    flights = _flight_starts(ops)
    changes = [(op, d.certain, None) for op, d in ops.deletes] + [
        (op, w.certain, w.value) for op, w in ops.writes
    ]
    for g_op, s in ops.stored:
        limit = float("inf")  # the earliest invocation of a change that may land after g began
        for c_op, certain, value in changes:
            # G's own write, if it returned another value, came before G read that value;
            # writing the value G returned changes nothing reads should see
            if c_op is g_op or (value is not None and value == s.value):
                continue
            if not certain or c_op.complete > g_op.invoke:
                limit = min(limit, c_op.invoke)
        for read, r in ops.reads:
            begin = flights.get(id(read), read.invoke)
            after = begin > g_op.complete + modes.allowed(read) and read.complete < limit
            if after and r.value != s.value:
                out.append(
                    Violation(
                        "get-or-set-stored",
                        key,
                        f"get_or_set G returned {s.value!r}, then the read saw {r.value!r} "
                        "with nothing in between that could change the key",
                        [("G", g_op), ("R", read)],
                    )
                )
                break
    return out


def _subset_sums(deltas: Sequence[int]) -> set[int]:
    sums = {0}
    for d in deltas:
        sums |= {s + d for s in sums}
    return sums


def _counter(key: str, ops: list[tuple[Op, Effect]]) -> list[Violation]:
    out: list[Violation] = []
    incrs = [(op, e) for op, e in ops if isinstance(e, Incr)]
    for op, e in ops:
        if isinstance(e, CounterMissing):
            out.append(
                Violation(
                    "counter", key, "incr found no counter (created before the run)", [("I", op)]
                )
            )
    # every value incr returned: within the bounds of the increments that may have happened
    for op, e in incrs:
        if not e.certain or e.result is None or op.name == "init_counter":
            continue
        low = high = 0
        for other, o in incrs:
            if other is op:
                continue
            before = o.certain and other.complete < op.invoke
            may = other.invoke < op.complete and not before
            if before:
                low += o.delta
                high += o.delta
            elif may:
                low += min(0, o.delta)
                high += max(0, o.delta)
        low += e.delta
        high += e.delta
        if not low <= e.result <= high:
            out.append(
                Violation(
                    "counter",
                    key,
                    f"incr returned {e.result}, outside [{low}, {high}], the sums its "
                    "increments and the ones that may have run by then allow",
                    [("I", op)],
                )
            )
    finals = [(op, e) for op, e in ops if isinstance(e, Read) and e.final]
    for op, e in finals:
        acked = sum(i.delta for _, i in incrs if i.certain)
        maybe = [i.delta for _, i in incrs if not i.certain]
        value = e.value
        if not isinstance(value, int) or value - acked not in _subset_sums(maybe):
            unsure = list(itertools.islice((o for o, i in incrs if not i.certain), 5))
            out.append(
                Violation(
                    "counter",
                    key,
                    f"final value {value!r}, but the acknowledged increments sum to {acked} "
                    f"and the {len(maybe)} indeterminate ones ({sorted(maybe)}) cannot make "
                    "up the difference",
                    [("R", op)] + [("?", o) for o in unsure],
                )
            )
    return out


# --------------------------------------------------------------------------- phase 2a models
# Availability, locks and set moves (issue 35): each a function (history, modes) ->
# violations, run by check() through EXTRA_MODELS. Sets, hashes, sorted sets and sessions need
# no model of their own: their ops map onto the register and counter models above (one
# register per set member, hash field, sorted-set member or session; see
# tests/history/ops_structures.py and ops_sessions.py).

#: What each nemesis promises (the one place it is stated): the nemeses under which the cache
#: stays available, so an operation that raised is a violation (rule ``unavailable``), and what
#: each one excuses. Not here: a crash (SIGKILL), a partition, a frozen master: their errors
#: are allowed.
AVAILABLE_UNDER: dict[str, str] = {
    "none": "a healthy topology: nothing raises",
    "client kill": "CLIENT KILL TYPE normal on a healthy master (the sentinels send it on every "
    "reconfiguration): a command written on a connection already closed is sent again, "
    "whatever its idempotence (issue 36 finding 7); excused: a non-idempotent op in flight "
    "across one kill (from its CLIENT KILL sent to KILL_GRACE after the fault proxy relayed it "
    "to the clients, nemeses.relayed: its reply was "
    "lost, it may have run, so it raises rather than run twice)",
    "planned failover": "SENTINEL FAILOVER: writes wait on the fence for the switch, within "
    "FAILOVER_HOLD (docs/failover.md), instead of failing; excused: a StaleReplyError inside "
    "the failover (a non-idempotent write sent before the fence whose reply came after the "
    "promotion: its outcome is unknown, so it raises rather than run twice; an idempotent one "
    "is sent again and never raises it)",
}
#: after a CLIENT KILL's end (nemeses.relayed: every closed connection's end relayed to the
#: clients by the fault proxy; without it, the kill's reply: the server closes them before it
#: replies, and loopback delivers at once), slack for the clock reads around it
KILL_GRACE = 0.001


def _excused(
    op: Op, kills: Sequence[Event], aborted: Sequence[Event], failovers: Sequence[Event] = ()
) -> bool:
    """A raise the nemesis excuses: in flight across one CLIENT KILL, a write held on the
    fence of a failover the sentinels gave up on (no new master came within FAILOVER_HOLD), or
    a reply that came across a planned failover's promotion."""
    if any(op.invoke <= k.end + KILL_GRACE and op.complete >= k.start for k in kills):
        return True
    if op.error.startswith("StaleReplyError") and any(
        op.invoke <= f.end and op.complete >= f.start for f in failovers
    ):
        return True
    return op.error.startswith("FailoverInProgressError") and any(
        op.invoke <= a.end and op.complete >= a.start for a in aborted
    )


#: ops whose value is a lock hold: {"token", "acquired", "begin", "held", "released", "timeout"}
LOCK_OPS = ("lock", "lock_expiring")


def _unavailable(history: History, modes: Modes) -> list[Violation]:
    """Every op that raised, when every nemesis of the run promises availability (a
    hand-written history without events promises nothing)."""
    kills = [e for e in history.events if e.name == KILL_SENT]
    aborted = [e for e in history.events if e.name == FAILOVER_ABORTED]
    failovers = [e for e in history.events if e.name == "planned failover"]
    names = {e.name for e in history.events if e.name not in (KILL_SENT, FAILOVER_ABORTED)}
    if not names or not names <= set(AVAILABLE_UNDER):
        return []
    promise = "; ".join(AVAILABLE_UNDER[n] for n in sorted(names))
    return [
        Violation(
            "unavailable",
            op.keys[0] if op.keys else "-",
            f"the op raised, though the nemesis promises availability ({promise})",
            [("E", op)],
        )
        for op in history.ops
        if op.kind == INFO and not _excused(op, kills, aborted, failovers)
    ]


def _lock_holds(history: History) -> dict[str, list[tuple[float, float, Op]]]:
    """Per lock, the certain holds: from the acquire's completion to the release's start,
    cut at the expiry (timeout after the acquire began: it may have been set that early)."""
    holds: dict[str, list[tuple[float, float, Op]]] = defaultdict(list)
    for op in history.ops:
        if op.name not in LOCK_OPS or op.kind != OK or not op.value.get("acquired"):
            continue
        v = op.value
        end = v["released"] if v.get("released") is not None else op.complete
        if v.get("timeout"):
            end = min(end, v["begin"] + v["timeout"])
        if end > v["held"]:
            holds[op.keys[0]].append((v["held"], end, op))
    return holds


def _locks(history: History, modes: Modes) -> list[Violation]:
    """lock-exclusive: no two certain holds of one lock overlap."""
    out: list[Violation] = []
    for key, holds in sorted(_lock_holds(history).items()):
        holds.sort(key=lambda h: h[0])
        latest: tuple[float, float, Op] | None = None
        for hold in holds:
            if latest is not None and hold[0] < latest[1]:
                a, b = latest[2], hold[2]
                out.append(
                    Violation(
                        "lock-exclusive",
                        key,
                        f"two holders at once: token {a.value['token']!r} held it from "
                        f"{latest[0] - history.t0:.4f} to {latest[1] - history.t0:.4f}, token "
                        f"{b.value['token']!r} acquired it at {hold[0] - history.t0:.4f}",
                        [("H1", a), ("H2", b)],
                    )
                )
            if latest is None or hold[1] > latest[1]:
                latest = hold
    return out


#: set ops, their keys (source, destination) and member: ``smove`` args (member,)
MOVE_OPS = ("smove",)
REMOVE_OPS = ("srem",)


def member_key(key: str, member: Any) -> str:
    """The register that stands for ``member``'s presence in the set ``key``."""
    return f"{key}|{member}"


def _smove_lost(history: History, modes: Modes) -> list[Violation]:
    """smove-lost: after a move that raised, the member's last reads in both sets (each begun
    after every op on that member ended) do not both miss, unless something removed it."""
    touched: dict[str, list[Op]] = defaultdict(list)  # member -> ops that may change it
    for op in history.ops:
        if op.name in MOVE_OPS or op.name in REMOVE_OPS or op.name == "sadd":
            for member in op.args:
                touched[str(member)].append(op)
    reads: dict[str, list[tuple[Op, Read]]] = defaultdict(list)
    for op in history.ops:
        for effect in effects(op):
            if isinstance(effect, Read) and "|" in effect.key:
                reads[effect.key].append((op, effect))
    out: list[Violation] = []
    for op in history.ops:
        if op.name not in MOVE_OPS or op.kind == OK:
            continue
        member = str(op.args[0])
        ops = touched[member]
        if any(o.name in REMOVE_OPS for o in ops):
            continue
        settled = max(o.complete for o in ops)
        last: list[tuple[Op, Read]] = []
        for key in op.keys[:2]:
            after = [(r, e) for r, e in reads[member_key(key, member)] if r.invoke > settled]
            if not after:
                break
            last.append(max(after, key=lambda pair: pair[0].invoke))
        if len(last) == 2 and all(e.value is None for _, e in last):
            out.append(
                Violation(
                    "smove-lost",
                    member,
                    "the move raised, and afterwards the member is in neither set",
                    [("M", op)] + [("R", r) for r, _ in last],
                )
            )
    return out


EXTRA_MODELS = [_unavailable, _locks, _smove_lost]
# --------------------------------------------------------------------------- scans and expiry
# (phase 2c: iter_keys / delete_pattern, keys written with a TTL; their ops are registered by
# history.ops_scans and history.ops_expiry)

#: Models run by :func:`check` after the register and counter models: ``model(history, modes)``
#: -> violations (each judges the effects only its own ops emit).
MODELS: list[Any] = []

#: How far a read may be from a TTL's edge (the server's and the clients' clocks are the same
#: machine's; the slack covers the server's ms rounding and the time a reply spends in transit)
EXPIRY_SLACK = 0.1

RULES.update(
    {
        "scan-missed": (
            "iter_keys returns every key present throughout the scan (an acknowledged write "
            "completed before the scan began, and no delete, acknowledged or not, could have "
            "run between that write's start and the scan's end); a key may come more than once, "
            "as Redis's SCAN allows",
            "none",
        ),
        "expired-read": (
            "a key written with a TTL is never read after its last acknowledged write's (or "
            "touch's) expiry plus EXPIRY_SLACK, and never missed before its write's earliest "
            "expiry minus EXPIRY_SLACK unless another op on the key (acknowledged or not) could "
            "have changed it meanwhile",
            "none (EXPIRY_SLACK: 0.1 s of clock and transit slack)",
        ),
    }
)


def _possible_changes(history: History, kinds: tuple[type, ...]) -> dict[str, list[Op]]:
    """Per key, the ops whose effects of ``kinds`` may have changed it."""
    out: dict[str, list[Op]] = defaultdict(list)
    for op in history.ops:
        for effect in effects(op):
            if isinstance(effect, kinds):
                out[effect.key].append(op)
    return out


def _latest_effect(op: Op) -> float:
    """The latest time an op may take effect: its completion if acknowledged, else never over."""
    return op.complete if op.kind == OK else float("inf")


def _scan_model(history: History, modes: Modes) -> list[Violation]:
    """scan-missed: for each iter_keys and each key of its pattern it did not return, was the
    key present throughout the scan? (Per key: the latest acknowledged write completed before
    the scan began, and a running maximum over the deletes by invocation of the latest time
    each may have taken effect: O(log n) a question.)"""
    from .ops_scans import Scanned

    out: list[Violation] = []
    writes: dict[str, list[Op]] = defaultdict(list)
    deleters: dict[str, list[Op]] = defaultdict(list)
    scans: list[tuple[Op, Scanned]] = []
    for op in history.ops:
        for effect in effects(op):
            if isinstance(effect, Write) and effect.certain:
                writes[effect.key].append(op)
            elif isinstance(effect, Delete):
                deleters[effect.key].append(op)
            elif isinstance(effect, Scanned) and not effect.returned:
                scans.append((op, effect))
    latest_write = {key: _Latest(ops) for key, ops in writes.items()}
    invokes: dict[str, list[float]] = {}
    reach: dict[str, list[float]] = {}  # [i]: the latest effect of the first i deletes
    for key, ops in deleters.items():
        ops.sort(key=lambda o: o.invoke)
        invokes[key] = [o.invoke for o in ops]
        running, acc = [float("-inf")], float("-inf")
        for o in ops:
            acc = max(acc, _latest_effect(o))
            running.append(acc)
        reach[key] = running
    for op, effect in scans:
        key = effect.key
        latest = latest_write.get(key)
        w = latest.before(op.invoke) if latest is not None else None
        if w is None:
            continue
        if key in invokes:
            begun = bisect.bisect_left(invokes[key], op.complete)
            if reach[key][begun] > w.invoke:
                continue  # a delete may have taken effect after W began, before the scan ended
        out.append(
            Violation(
                "scan-missed",
                key,
                "iter_keys did not return the key, though W wrote it (acknowledged) before the "
                "scan began and nothing could have deleted it before the scan ended",
                [("W", w), ("S", op)],
            )
        )
    return out


MODELS.append(_scan_model)


def _expiry_model(history: History, modes: Modes) -> list[Violation]:
    """expired-read on the keys written with a TTL (history.ops_expiry's effects)."""
    from .ops_expiry import Expiring, ExpiryRead, Touched

    out: list[Violation] = []
    writes: dict[str, list[tuple[Op, Expiring]]] = defaultdict(list)
    touches: dict[str, list[tuple[Op, Touched]]] = defaultdict(list)
    reads: dict[str, list[tuple[Op, ExpiryRead]]] = defaultdict(list)
    others: dict[str, list[Op]] = defaultdict(list)  # every op that may change the key
    for op in history.ops:
        for effect in effects(op):
            if isinstance(effect, Expiring):
                writes[effect.key].append((op, effect))
                others[effect.key].append(op)
            elif isinstance(effect, Touched):
                touches[effect.key].append((op, effect))
                others[effect.key].append(op)
            elif isinstance(effect, ExpiryRead):
                reads[effect.key].append((op, effect))
    for key, key_reads in sorted(reads.items()):
        writer = {e.value: (op, e) for op, e in writes[key]}
        for read, r in key_reads:
            if r.value is not None:
                if r.value not in writer:
                    out.append(
                        Violation("phantom", key, f"read {r.value!r}, never written", [("R", read)])
                    )
                    continue
                w_op, w = writer[r.value]
                # its latest possible expiry: the write's, or a touch that may have followed it
                deadline = _latest_effect(w_op) + w.ttl
                extended: Op | None = None
                for t_op, t in touches[key]:
                    if t_op.invoke < read.complete and _latest_effect(t_op) > w_op.invoke:
                        if t.certain and t_op.kind == OK:
                            if t_op.complete + t.ttl > deadline:
                                deadline, extended = t_op.complete + t.ttl, t_op
                        else:
                            deadline, extended = float("inf"), t_op
                if read.invoke > deadline + EXPIRY_SLACK:
                    roles = [("W", w_op)] + ([("T", extended)] if extended else []) + [("R", read)]
                    out.append(
                        Violation(
                            "expired-read",
                            key,
                            f"the read returned W's value {read.invoke - deadline:.3f}s after "
                            f"its expiry (TTL {w.ttl}s)",
                            roles,
                        )
                    )
                continue
            # a miss: before the earliest expiry of an acknowledged write, with nothing between
            for w_op, w in writes[key]:
                if not (w.certain and w_op.complete < read.invoke):
                    continue
                if read.complete >= w_op.invoke + w.ttl - EXPIRY_SLACK:
                    continue
                changed = any(
                    o is not w_op and o.invoke < read.complete and _latest_effect(o) > w_op.invoke
                    for o in others[key]
                )
                if not changed:
                    out.append(
                        Violation(
                            "expired-read",
                            key,
                            f"the read missed {w_op.invoke + w.ttl - read.complete:.3f}s before "
                            f"W's value could expire (TTL {w.ttl}s), nothing else on the key",
                            [("W", w_op), ("R", read)],
                        )
                    )
                    break
    return out


MODELS.append(_expiry_model)
