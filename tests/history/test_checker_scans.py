"""The checker's scan, expiry and from-the-masters models check themselves: hand-written
histories with each anomaly, and the ones that must not be flagged. Pure: no servers."""

from __future__ import annotations

from .checker import EXPIRY_SLACK, RULES
from .final_masters import read_masters  # noqa: F401 - registers final_master_get
from .ops_expiry import EXPIRY_OPS
from .ops_scans import SCAN_OPS
from .recorder import INFO, OK, OPS, Op
from .test_checker import delete, get, judged, op, w

KEYS = ("k", "j")


def scan(returned: list[str], at: tuple[float, float], kind: str = OK) -> Op:
    return op("iter_keys", KEYS, (), at, kind, returned if kind == OK else None)


def pattern_deleted(at: tuple[float, float], kind: str = OK) -> Op:
    return op("delete_pattern", KEYS, (), at, kind, 2 if kind == OK else None)


def test_the_new_rules_are_stated_and_the_ops_registered() -> None:
    assert {"scan-missed", "expired-read"} <= set(RULES)
    assert set(SCAN_OPS) | set(EXPIRY_OPS) | {"final_master_get"} <= set(OPS)


# ------------------------------------------------------------------ scans


def test_a_scan_returning_every_present_key_is_clean_duplicates_allowed() -> None:
    history = [w("a", (0, 1)), w("b", (0, 1), key="j"), scan(["k", "j", "k"], (2, 3))]
    assert judged(*history) == {}


def test_a_scan_missing_a_key_present_throughout_is_reported() -> None:
    history = [w("a", (0, 1)), w("b", (0, 1), key="j"), scan(["j"], (2, 3))]
    assert judged(*history) == {"scan-missed": 1}


def test_a_key_deleted_or_written_during_the_scan_may_be_missed() -> None:
    assert judged(w("a", (0, 1)), delete((2.5, 2.6)), scan([], (2, 3))) == {}
    # an indeterminate delete that began before the scan ended: may have taken effect
    assert judged(w("a", (0, 1)), delete((1.5, 1.6), INFO), scan([], (2, 3))) == {}
    # written while the scan ran: not present throughout
    assert judged(w("a", (2.2, 2.4)), scan([], (2, 3))) == {}
    # an acknowledged delete that completed before the write began does not excuse it
    assert judged(delete((0, 0.5)), w("a", (1, 1.5)), scan([], (2, 3))) == {"scan-missed": 1}
    # a scan that raised is not judged
    assert judged(w("a", (0, 1)), scan([], (2, 3), INFO)) == {}


def test_delete_pattern_is_judged_as_a_delete_of_every_key() -> None:
    # a value written before it began, read after it completed: undone
    assert judged(w("a", (0, 1)), pattern_deleted((2, 3)), get("a", (4, 5))) == {"delete-undone": 1}
    # written again during it: may survive
    assert (
        judged(w("a", (0, 1)), pattern_deleted((2, 3)), w("b", (2.5, 2.6)), get("b", (4, 5))) == {}
    )
    # after it, the final read finds the key gone: no lost write
    assert judged(w("a", (0, 1)), pattern_deleted((2, 3)), get(None, (4, 5), final=True)) == {}
    # an indeterminate one may not have happened: a read of the old value is fine
    assert judged(w("a", (0, 1)), pattern_deleted((2, 3), INFO), get("a", (4, 5))) == {}


# ------------------------------------------------------------------ expiry


def ttl_write(value: str, ttl: float, at: tuple[float, float], kind: str = OK) -> Op:
    return op("set_ttl", "t", (value, ttl), at, kind, True if kind == OK else None)


def touch(ttl: float, at: tuple[float, float], kind: str = OK, value: bool = True) -> Op:
    return op("touch_ttl", "t", (ttl,), at, kind, value if kind == OK else None)


def ttl_read(value: str | None, at: tuple[float, float], name: str = "get_ttl") -> Op:
    return op(name, "t", (), at, OK, value)


def test_reads_within_a_ttl_and_misses_after_it_are_clean() -> None:
    history = [
        ttl_write("a", 1.0, (0, 0.1)),
        ttl_read("a", (0.5, 0.6)),
        ttl_read("a", (1.0, 1.05)),  # the edge: within the slack
        ttl_read(None, (1.3, 1.4)),
    ]
    assert judged(*history) == {}


def test_a_value_read_after_its_expiry_is_reported() -> None:
    late = 0.1 + 1.0 + EXPIRY_SLACK + 0.05
    assert judged(ttl_write("a", 1.0, (0, 0.1)), ttl_read("a", (late, late + 0.01))) == {
        "expired-read": 1
    }
    # the write-once keys, read first after their TTL, are judged the same way
    lazy = op("lazy_set", "t", ("a", 1.0), (0, 0.1), OK, True)
    assert judged(lazy, ttl_read("a", (2, 2.01), name="lazy_get")) == {"expired-read": 1}


def test_a_touch_extends_the_ttl_and_an_indeterminate_one_may_have() -> None:
    write = ttl_write("a", 1.0, (0, 0.1))
    assert judged(write, touch(2.0, (0.5, 0.6)), ttl_read("a", (2.0, 2.1))) == {}
    assert judged(write, touch(2.0, (0.5, 0.6), INFO), ttl_read("a", (5, 5.1))) == {}
    # a touch that found no key (False) extends nothing
    assert judged(write, touch(2.0, (0.5, 0.6), value=False), ttl_read("a", (2.0, 2.1))) == {
        "expired-read": 1
    }


def test_a_miss_before_the_ttl_is_reported_unless_something_else_ran() -> None:
    write = ttl_write("a", 2.0, (0, 0.1))
    assert judged(write, ttl_read(None, (0.5, 0.6))) == {"expired-read": 1}
    # an overwrite (even indeterminate) or a touch may have changed it
    assert judged(write, ttl_write("b", 1.0, (0.2, 0.3), INFO), ttl_read(None, (0.5, 0.6))) == {}
    assert judged(write, touch(0.1, (0.2, 0.3)), ttl_read(None, (0.5, 0.6))) == {}
    # an indeterminate write is never trusted: its value's absence is no violation
    assert judged(ttl_write("a", 2.0, (0, 0.1), INFO), ttl_read(None, (0.5, 0.6))) == {}


def test_a_value_nobody_wrote_is_a_phantom() -> None:
    assert judged(ttl_read("x", (0.5, 0.6))) == {"phantom": 1}


# ------------------------------------------------------------------ the masters' final read


def test_the_masters_final_read_judges_lost_writes_as_the_caches() -> None:
    final = op("final_master_get", "k", (), (4, 5), OK, None)
    assert judged(w("a", (0, 1)), final) == {"lost-write": 1}
    assert judged(w("a", (0, 1)), op("final_master_get", "k", (), (4, 5), OK, "a")) == {}
    # an error reading a master is not a read
    assert judged(w("a", (0, 1)), op("final_master_get", "k", (), (4, 5), INFO)) == {}
