"""The checker checks itself: hand-written histories with each kind of anomaly, and tricky ones
(indeterminate ops, concurrent overwrites, refused conditional writes) that must not be flagged.
Pure: no servers."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from .checker import RULES, STRICT, Modes, check
from .recorder import FAIL, INFO, OK, OPS, History, Op, merge

_seq = iter(range(10**9))


def op(
    name: str,
    keys: str | tuple[str, ...],
    args: tuple[Any, ...] = (),
    at: tuple[float, float] = (0.0, 1.0),
    kind: str = OK,
    value: Any = None,
    client: str = "c1",
) -> Op:
    keys = (keys,) if isinstance(keys, str) else keys
    error = "" if kind == OK else "ShardUnavailableError: boom"
    return Op(0, client, next(_seq), name, keys, args, at[0], at[1], kind, value, error)


def judged(*ops: Op, modes: Modes = STRICT) -> dict[str, int]:
    verdict = check(History(merge(ops)), modes)
    assert all(v.report() for v in verdict.violations)
    return verdict.by_rule()


def w(value: str, at: tuple[float, float], kind: str = OK, key: str = "k", **kw: Any) -> Op:
    return op("set", key, (value,), at, kind, True if kind == OK else None, **kw)


def get(value: Any, at: tuple[float, float], key: str = "k", final: bool = False) -> Op:
    return op("final_get" if final else "get", key, (), at, OK, value)


def delete(at: tuple[float, float], kind: str = OK, key: str = "k") -> Op:
    return op("delete", key, (), at, kind, True if kind == OK else None)


# ------------------------------------------------------------------ clean histories


def test_a_clean_history_has_no_violation() -> None:
    assert (
        judged(
            w("a", (0, 1)),
            get("a", (2, 3)),
            w("b", (4, 5)),
            get("b", (6, 7)),
            delete((8, 9)),
            get(None, (10, 11)),
            get(None, (12, 13), final=True),
        )
        == {}
    )


def test_concurrent_overwrite_may_be_read_either_way() -> None:
    # X began before W completed: either order is linearizable
    assert judged(w("a", (0, 2)), w("b", (1, 3)), get("a", (4, 5)), get("b", (6, 7))) == {}


def test_a_read_overlapping_the_overwrite_may_see_the_old_value() -> None:
    assert judged(w("a", (0, 1)), w("b", (2, 4)), get("a", (3, 5))) == {}


# ------------------------------------------------------------------ stale, undone, lost


def test_a_read_after_an_acknowledged_overwrite_is_stale() -> None:
    assert judged(w("a", (0, 1)), w("b", (2, 3)), get("a", (4, 5))) == {"stale-read": 1}


def test_a_read_after_an_acknowledged_delete_is_a_delete_undone() -> None:
    assert judged(w("a", (0, 1)), delete((2, 3)), get("a", (4, 5))) == {"delete-undone": 1}


def test_a_miss_after_an_acknowledged_write_with_no_delete_is_stale() -> None:
    assert judged(w("a", (0, 1)), get(None, (2, 3))) == {"stale-read": 1}


def test_a_final_miss_is_a_lost_write() -> None:
    assert judged(w("a", (0, 1)), get(None, (9, 10), final=True)) == {"lost-write": 1}


def test_a_final_read_of_an_overwritten_value_is_a_lost_write() -> None:
    assert judged(w("a", (0, 1)), w("b", (2, 3)), get("a", (9, 10), final=True)) == {
        "lost-write": 1
    }


def test_lag_allowed_by_a_mode_relaxes_stale_reads_within_its_bound_only() -> None:
    history = (w("a", (0, 1)), w("b", (2, 3)), get("a", (3.5, 3.6)))
    assert judged(*history, modes=Modes(lag=1.0)) == {}
    assert judged(*history, modes=Modes(lag=0.2)) == {"stale-read": 1}
    # the mode applies inside its windows only
    assert judged(*history, modes=Modes(lag=1.0, windows=((10.0, 20.0),))) == {"stale-read": 1}


def test_a_fail_open_window_allows_misses_only_and_only_inside_it() -> None:
    missed = (w("a", (0, 1)), get(None, (3.5, 3.6)))
    stale = (w("a", (0, 1)), w("b", (2, 3)), get("a", (3.5, 3.6)))
    assert judged(*missed, modes=Modes(misses=((3.0, 4.0),))) == {}
    assert judged(*missed, modes=Modes(misses=((10.0, 20.0),))) == {"stale-read": 1}
    assert judged(*stale, modes=Modes(misses=((3.0, 4.0),))) == {"stale-read": 1}


# ------------------------------------------------------------------ indeterminate ops


def test_an_indeterminate_overwrite_proves_nothing_stale() -> None:
    assert judged(w("a", (0, 1)), w("b", (2, 3), INFO), get("a", (4, 5))) == {}


def test_an_indeterminate_write_may_land_late_even_after_an_acked_overwrite() -> None:
    # "a" raised at t=1 but was delivered later (a partition healed): reading it after b is fine
    assert judged(w("a", (0, 1), INFO), w("b", (2, 3)), get("a", (4, 5))) == {}


def test_an_indeterminate_delete_explains_a_miss_even_if_it_began_first() -> None:
    assert judged(delete((-2, -1), INFO), w("a", (0, 1)), get(None, (2, 3))) == {}


def test_an_acknowledged_delete_that_ended_before_the_write_explains_no_miss() -> None:
    assert judged(delete((-2, -1)), w("a", (0, 1)), get(None, (2, 3))) == {"stale-read": 1}


def test_an_acknowledged_delete_concurrent_with_the_write_explains_a_miss() -> None:
    assert judged(w("a", (0, 1)), delete((0.5, 1.5)), get(None, (2, 3))) == {}


def test_a_definitely_failed_delete_explains_nothing() -> None:
    assert judged(w("a", (0, 1)), delete((1.5, 1.6), FAIL), get(None, (2, 3))) == {"stale-read": 1}


def test_refused_conditional_writes_change_nothing() -> None:
    history = [
        w("a", (0, 1)),
        op("add", "k", ("b",), (2, 3), OK, False),
        op("set_nx", "k", ("c",), (2, 3), OK, False),
        op("set_xx", "x", ("d",), (2, 3), OK, False),
        get("a", (4, 5)),
    ]
    assert judged(*history) == {}
    # a refused add's value read back: stored after all, though it said not
    assert judged(*history, get("b", (6, 7))) == {"phantom": 1}
    # an acknowledged conditional write is an overwrite like any other
    assert judged(
        w("a", (0, 1)), op("set_xx", "k", ("b",), (2, 3), OK, True), get("a", (4, 5))
    ) == {"stale-read": 1}


def test_set_many_keys_it_reports_failed_are_indeterminate() -> None:
    partial = op("set_many", ("k", "j"), (("k", "b"), ("j", "c")), (2, 3), OK, ["k"])
    assert judged(w("a", (0, 1)), partial, get("a", (4, 5))) == {}
    assert judged(w("a", (0, 1), key="j"), partial, get("a", (4, 5), key="j")) == {"stale-read": 1}


def test_get_many_reads_each_key() -> None:
    assert judged(
        w("a", (0, 1)),
        w("b", (2, 3)),
        op("get_many", ("k", "j"), (), (4, 5), OK, {"k": "a"}),
    ) == {"stale-read": 1}


# ------------------------------------------------------------------ phantoms


def test_a_value_nobody_wrote_is_a_phantom() -> None:
    assert judged(w("a", (0, 1)), get("zz", (2, 3))) == {"phantom": 1}


def test_a_value_written_to_another_key_is_a_phantom() -> None:
    assert judged(w("a", (0, 1), key="j"), get("a", (2, 3))) == {"phantom": 1}


def test_a_value_read_before_its_write_began_is_a_phantom() -> None:
    assert judged(get("a", (0, 1)), w("a", (2, 3))) == {"phantom": 1}


# ------------------------------------------------------------------ counters


def incr(delta: int, at: tuple[float, float], kind: str = OK, result: Any = None) -> Op:
    return op("incr" if delta > 0 else "decr", "c", (delta,), at, kind, result)


INIT = op("init_counter", "c", (), (-2, -1), OK, True)


def test_counters_end_at_the_acked_increments_plus_some_indeterminate_ones() -> None:
    ops = [INIT, incr(2, (0, 1), result=2), incr(3, (2, 3), INFO), incr(-1, (4, 5), result=4)]
    assert judged(*ops, get(4, (9, 10), key="c", final=True)) == {}  # the 3 landed
    ops[3] = incr(-1, (4, 5), result=1)
    assert judged(*ops, get(1, (9, 10), key="c", final=True)) == {}  # it did not
    assert judged(*ops, get(3, (9, 10), key="c", final=True)) == {"counter": 1}


def test_an_incr_result_outside_its_bounds_is_flagged() -> None:
    assert judged(INIT, incr(2, (0, 1), result=2), incr(1, (2, 3), result=7)) == {"counter": 1}
    # concurrent increments widen the bounds
    assert judged(INIT, incr(5, (0, 3), result=6), incr(1, (1, 2), result=1)) == {}


def test_a_counter_gone_missing_is_flagged() -> None:
    assert judged(INIT, incr(1, (0, 1), FAIL)) == {"counter": 1}


# ------------------------------------------------------------------ get_or_set


def test_get_or_set_value_must_stay_until_something_changes_the_key() -> None:
    # G returned "u", written by an indeterminate set (so the miss rule proves nothing)
    g = op("get_or_set", "k", ("mine", True), (2, 3), OK, "u")
    assert judged(w("u", (0, 1), INFO), g, get(None, (4, 5))) == {"get-or-set-stored": 1}
    assert judged(w("u", (0, 1), INFO), g, delete((3.5, 3.6), INFO), get(None, (4, 5))) == {}


def test_get_or_set_own_value_is_a_write() -> None:
    g = op("get_or_set_plain", "k", ("mine", False), (0, 1), OK, "mine")
    assert judged(g, get("mine", (2, 3))) == {}
    assert judged(g, get(None, (2, 3))) == {"stale-read": 1, "get-or-set-stored": 1}


# ------------------------------------------------------------------ the table itself


def test_rules_are_stated_once_with_what_relaxes_them() -> None:
    assert set(RULES) == {
        "lost-write",
        "stale-read",
        "delete-undone",
        "phantom",
        "counter",
        "get-or-set-stored",
        # phase 2a (tests/history/test_checker_structures.py)
        "unavailable",
        "lock-exclusive",
        "smove-lost",
        # phase 2c
        "scan-missed",
        "expired-read",
    }
    assert all(text and relaxed for text, relaxed in RULES.values())
    with pytest.raises(ValueError, match="unknown rules"):
        check(History([]), rules=["no-such-rule"])


def test_every_op_states_its_effects() -> None:
    for name, spec in OPS.items():
        sample = op(name, ("k",), (), (0, 1), INFO)
        if name in ("set", "set_nx", "set_xx", "add"):
            sample = op(name, "k", ("v",), (0, 1), INFO)
        elif name in ("incr", "decr"):
            sample = op(name, "c", (1,), (0, 1), INFO)
        elif name.startswith("get_or_set"):
            sample = op(name, "k", ("v", True), (0, 1), INFO)
        elif name == "set_many":
            sample = op(name, ("k",), (("k", "v"),), (0, 1), INFO)
        # phase 2c: the expiry ops (history.ops_expiry) write and touch with a TTL
        elif name in ("set_ttl", "lazy_set"):
            sample = op(name, "t", ("v", 1.0), (0, 1), INFO)
        elif name == "touch_ttl":
            sample = op(name, "t", (1.0,), (0, 1), INFO)
        elif name == "set_extra":  # history.ops_scans: a key of the scans' pattern
            sample = op(name, "k", ("v",), (0, 1), INFO)
        assert isinstance(spec.effects(sample), list), name


def test_a_violation_reads_as_a_bug_report() -> None:
    verdict = check(History(merge([w("a", (0, 1)), delete((2, 3)), get("a", (4, 5))])))
    (violation,) = verdict.violations
    text = violation.report()
    assert "delete-undone on k" in text
    assert "set(" in text and "delete(" in text and "get(" in text
    assert "[4.0000, 5.0000]" in text


def test_get_or_set_returning_another_value_may_still_have_stored_its_own() -> None:
    g = op("get_or_set_plain", "k", ("mine", False), (0, 2), OK, "u")
    # it added "mine", then "u" overwrote it, then it read "u": "mine" was there meanwhile
    assert judged(w("u", (0.5, 1)), g, get("mine", (0.2, 0.3))) == {}
    # but not after it returned "u" (its own write came before its read)
    assert judged(w("u", (0.5, 1)), g, get("mine", (3, 4))) == {"get-or-set-stored": 1}


def test_get_or_set_joining_a_flight_of_its_process_reads_as_of_the_flight() -> None:
    leader = op("get_or_set", "k", ("l", True), (1.0, 3.0), OK, "a", client="p0t0")
    joiner = op("get_or_set", "k", ("j", True), (2.5, 3.0), OK, "a", client="p0t1")
    history = [w("a", (0, 0.5)), leader, w("b", (2.0, 2.2)), joiner]
    assert judged(*history) == {}
    # a caller of another process shares no flight: its read is stale
    other = Op(1, "p1t0", 99, "get_or_set", ("k",), ("o", True), 2.5, 3.0, OK, "a")
    assert judged(*history[:3], other) == {"stale-read": 1}
    # nor does a get_or_set with a plain value (no computation, no flight)
    plain = op("get_or_set_plain", "k", ("j", False), (2.5, 3.0), OK, "a", client="p0t1")
    assert judged(*history[:3], plain) == {"stale-read": 1}


def test_the_docs_table_lists_every_rule() -> None:
    page = Path(__file__).resolve().parents[2] / "docs" / "reliability.md"
    section = page.read_text().split("## The history checker", 1)[1].split("\n## ", 1)[0]
    listed = set(re.findall(r"^\| `([a-z-]+)` \|", section, re.MULTILINE))
    assert listed == set(RULES)
