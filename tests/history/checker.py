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
}


@dataclass(frozen=True)
class Modes:
    """What the scenario's options allow: reads may lag the last write by up to ``lag`` seconds
    (inside ``windows`` only, if given: (start, end) monotonic times)."""

    lag: float = 0.0
    windows: tuple[tuple[float, float], ...] | None = None
    why: str = ""

    def allowed(self, read: Op) -> float:
        if self.windows is None:
            return self.lag
        inside = any(s <= read.complete and read.invoke <= e for s, e in self.windows)
        return self.lag if inside else 0.0


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
