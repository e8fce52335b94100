"""The phase-2a models check themselves (pure, no servers): hand-written histories of sets
(with smove), hashes, sorted sets, locks, sessions and raised ops under each nemesis, with and
without the anomaly each rule names."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from . import ops_sessions, ops_structures  # noqa: F401 - registers the ops
from .checker import AVAILABLE_UNDER, RULES, check
from .nemeses import FAILOVER_ABORTED, KILL_SENT
from .recorder import INFO, OK, Event, History, Op, merge
from .test_checker import op


def judged(*ops: Op, events: tuple[Event, ...] = ()) -> dict[str, int]:
    verdict = check(History(merge(ops), list(events)))
    assert all(v.report() for v in verdict.violations)
    return verdict.by_rule()


def test_the_new_rules_are_stated() -> None:
    for rule in ("unavailable", "lock-exclusive", "smove-lost"):
        text, relaxed = RULES[rule]
        assert text and relaxed


# ------------------------------------------------------------------ sets


def sadd(key: str, m: str, at: tuple[float, float], kind: str = OK) -> Op:
    return op("sadd", key, (m,), at, kind, 1 if kind == OK else None)


def ismember(key: str, m: str, value: bool, at: tuple[float, float]) -> Op:
    return op("sismember", key, (m,), at, OK, value)


def smove(
    src: str, dst: str, m: str, at: tuple[float, float], kind: str = OK, value: Any = True
) -> Op:
    return op("smove", (src, dst), (m,), at, kind, value if kind == OK else None)


def test_a_member_added_and_removed_reads_present_then_absent() -> None:
    assert (
        judged(
            sadd("A", "m", (0, 1)),
            ismember("A", "m", True, (2, 3)),
            op("smembers", "A", (), (2, 3), OK, ["m"]),
            op("srem", "A", ("m",), (4, 5), OK, 1),
            ismember("A", "m", False, (6, 7)),
        )
        == {}
    )


def test_an_acknowledged_member_missing_is_a_stale_read() -> None:
    assert judged(sadd("A", "m", (0, 1)), ismember("A", "m", False, (2, 3))) == {"stale-read": 1}


def test_a_removed_member_coming_back_is_a_delete_undone() -> None:
    assert judged(
        sadd("A", "m", (0, 1)),
        op("srem", "A", ("m",), (2, 3), OK, 1),
        op("smembers", "A", (), (4, 5), OK, ["m"]),
    ) == {"delete-undone": 1}


def test_a_member_nobody_added_is_a_phantom() -> None:
    assert judged(op("sinter", ("A", "B"), (), (0, 1), OK, ["x"])) == {"phantom": 2}


def test_a_raised_add_may_or_may_not_be_there() -> None:
    assert (
        judged(
            sadd("A", "m", (0, 1), INFO),
            ismember("A", "m", False, (2, 3)),
            ismember("A", "m", True, (4, 5)),
        )
        == {}
    )


def test_an_acknowledged_move_leaves_the_member_in_the_destination_only() -> None:
    clean = [sadd("A", "m", (0, 1)), smove("A", "B", "m", (2, 3))]
    assert judged(*clean, ismember("A", "m", False, (4, 5)), ismember("B", "m", True, (4, 5))) == {}
    # duplicated: still in the source after the move
    assert judged(*clean, ismember("A", "m", True, (4, 5))) == {"delete-undone": 1}
    # lost: not in the destination after the move
    assert judged(*clean, ismember("B", "m", False, (4, 5))) == {"stale-read": 1}


def test_a_move_that_raised_may_leave_the_member_in_either_set_but_not_neither() -> None:
    base = [sadd("A", "m", (0, 1)), smove("A", "B", "m", (2, 3), INFO)]
    assert judged(*base, ismember("A", "m", True, (4, 5)), ismember("B", "m", False, (4, 5))) == {}
    assert judged(*base, ismember("A", "m", False, (4, 5)), ismember("B", "m", True, (4, 5))) == {}
    assert judged(*base, ismember("A", "m", False, (4, 5)), ismember("B", "m", False, (4, 5))) == {
        "smove-lost": 1
    }
    # removed by someone: absent from both is allowed
    removed = op("srem", "A", ("m",), (2, 3), INFO)
    assert (
        judged(*base, removed, ismember("A", "m", False, (4, 5)), ismember("B", "m", False, (4, 5)))
        == {}
    )


def test_a_move_that_found_nothing_is_a_read_of_the_source() -> None:
    assert judged(sadd("A", "m", (0, 1)), smove("A", "B", "m", (2, 3), OK, False)) == {
        "stale-read": 1
    }


# ------------------------------------------------------------------ hashes, sorted sets


def test_hash_fields_are_registers() -> None:
    base = [
        op("hset", "h", ("f0", "v1"), (0, 1), OK, 1),
        op("hset", "h", ("f0", "v2"), (2, 3), OK, 0),
    ]
    assert judged(*base, op("hget", "h", ("f0",), (4, 5), OK, "v2")) == {}
    assert judged(*base, op("hget", "h", ("f0",), (4, 5), OK, "v1")) == {"stale-read": 1}
    assert judged(*base, op("hgetall", "h", ("f1",), (4, 5), OK, {"f0": "v2", "f1": "zz"})) == {
        "phantom": 1
    }
    deleted = [*base, op("hdel", "h", ("f0",), (4, 5), OK, 1)]
    assert judged(*deleted, op("hgetall", "h", ("f0",), (6, 7), OK, {})) == {}
    assert judged(*deleted, op("hgetall", "h", ("f0",), (6, 7), OK, {"f0": "v2"})) == {
        "delete-undone": 1
    }


def test_sorted_set_scores_and_zincrby() -> None:
    assert (
        judged(
            op("zadd", "z", ("m0", 5.0), (0, 1), OK, 1), op("zscore", "z", ("m0",), (2, 3), OK, 5.0)
        )
        == {}
    )
    assert judged(
        op("zadd", "z", ("m0", 5.0), (0, 1), OK, 1), op("zscore", "z", ("m0",), (2, 3), OK, None)
    ) == {"stale-read": 1}
    incrs = [op("zincrby", "z", (2,), (0, 1), OK, 2.0), op("zincrby", "z", (3,), (2, 3), OK, 5.0)]
    assert judged(*incrs) == {}
    assert judged(incrs[0], op("zincrby", "z", (3,), (2, 3), OK, 9.0)) == {"counter": 1}


# ------------------------------------------------------------------ locks


def hold(
    key: str, token: str, begin: float, held: float, released: float, timeout: float = 10
) -> Op:
    value = {"acquired": True, "begin": begin, "held": held, "released": released,
             "timeout": timeout, "token": token}  # fmt: skip
    return op("lock", key, (0.01, timeout), (begin, released + 0.01), OK, value)


def test_holds_one_after_another_are_fine() -> None:
    assert (
        judged(hold("L", "a", 0, 1, 2), hold("L", "b", 0.5, 2.5, 3), hold("M", "c", 0, 1, 3)) == {}
    )


def test_two_holders_at_once_are_a_violation() -> None:
    assert judged(hold("L", "a", 0, 1, 3), hold("L", "b", 1.5, 2, 4)) == {"lock-exclusive": 1}


def test_a_hold_past_its_timeout_may_have_expired() -> None:
    # a's lock expired 1 s after its acquire began: b acquiring at 2 is fine
    assert judged(hold("L", "a", 0, 0.1, 3, timeout=1), hold("L", "b", 1.5, 2, 4, timeout=1)) == {}


def test_an_acquire_that_failed_or_raised_holds_nothing() -> None:
    refused = op("lock", "L", (0.01, 10), (1, 2), OK, {"acquired": False, "begin": 1, "held": 2})
    raised = op("lock", "L", (0.01, 10), (1, 2), INFO)
    assert judged(hold("L", "a", 0, 1, 3), refused, raised) == {}


# ------------------------------------------------------------------ sessions


def test_a_saved_session_is_loadable_until_flushed() -> None:
    created = op("session_create", (), ("v1",), (0, 1), OK, {"key": "s1"})
    saved = op("session_save", "s1", ("v2",), (2, 3), OK, {"seen": "v1", "key": "s1"})
    assert judged(created, saved, op("session_load", "s1", (), (4, 5), OK, "v2")) == {}
    # logged out: the load missed
    assert judged(created, saved, op("session_load", "s1", (), (4, 5), OK, None)) == {
        "stale-read": 1
    }
    # an old copy: the save's data lost
    assert judged(created, saved, op("session_load", "s1", (), (4, 5), OK, "v1")) == {
        "stale-read": 1
    }
    flushed = op("session_flush", "s1", (), (4, 5), OK, True)
    assert judged(created, saved, flushed, op("session_load", "s1", (), (6, 7), OK, None)) == {}
    # a flushed session came back
    assert judged(created, saved, flushed, op("session_load", "s1", (), (6, 7), OK, "v2")) == {
        "delete-undone": 1
    }


def test_a_save_that_found_the_session_gone_wrote_nothing() -> None:
    created = op("session_create", (), ("v1",), (0, 1), OK, {"key": "s1"})
    flushed = op("session_flush", "s1", (), (2, 3), OK, True)
    gone = op("session_save", "s1", ("v2",), (4, 5), OK, {"seen": None, "key": None})
    assert judged(created, flushed, gone, op("session_load", "s1", (), (6, 7), OK, None)) == {}


# ------------------------------------------------------------------ availability


def raised(at: tuple[float, float]) -> Op:
    return op("incr", "c", (1,), at, INFO)


def test_an_op_that_raised_under_a_promise_of_availability_is_a_violation() -> None:
    for name in ("none", "planned failover"):
        assert judged(raised((1, 2)), events=(Event(name, 0, 3),)) == {"unavailable": 1}


def test_nemeses_that_promise_nothing_excuse_every_error() -> None:
    assert "kill master" not in AVAILABLE_UNDER
    assert judged(raised((1, 2)), events=(Event("kill master", 0, 3),)) == {}
    assert judged(raised((1, 2))) == {}  # a history without events promises nothing
    mixed = (Event("client kill", 0, 3), Event("kill master", 3, 4))
    assert judged(raised((1, 2)), events=mixed) == {}


def test_an_aborted_failover_excuses_only_the_writes_its_fence_held_and_failed() -> None:
    events = (Event("planned failover", 1.0, 20.0), Event(FAILOVER_ABORTED, 1.0, 13.0))
    held = replace(raised((1.5, 3.5)), error="FailoverInProgressError: writes held for 2s")
    assert judged(held, events=events) == {}
    # another error in that window, or the fence's error outside it (the second attempt)
    assert judged(raised((1.5, 3.5)), events=events) == {"unavailable": 1}
    late = replace(held, invoke=14.0, complete=16.0)
    assert judged(late, events=events) == {"unavailable": 1}


def test_a_planned_failover_excuses_only_a_reply_across_its_promotion() -> None:
    events = (Event("planned failover", 1.0, 3.0),)
    stale = replace(raised((1.5, 1.6)), error="StaleReplyError: ... outcome is unknown")
    assert judged(stale, events=events) == {}
    # another error inside the failover, or a stale reply outside it
    assert judged(raised((1.5, 1.6)), events=events) == {"unavailable": 1}
    assert judged(replace(stale, invoke=4.0, complete=4.1), events=events) == {"unavailable": 1}


def test_client_kill_excuses_only_the_ops_in_flight_across_a_kill() -> None:
    kills = (
        Event("client kill", 0.9, 3.1),
        Event(KILL_SENT, 1.0, 1.001),
        Event(KILL_SENT, 2.0, 2.001),
    )
    assert judged(raised((0.99, 1.02)), raised((1.995, 2.003)), events=kills) == {}
    # written after a kill's reply (the connection already closed): must have been sent again
    assert judged(raised((1.05, 1.07)), events=kills) == {"unavailable": 1}
    assert judged(raised((2.5, 2.6)), events=kills) == {"unavailable": 1}
