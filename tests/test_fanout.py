"""The one fan-out of the core (``sentinel_cache.core.fanout``, issue 23): discovery, the status
report, the health probes and the deploy check ask their nodes through it, so what it promises
holds for all of them: the deadline is kept whatever a task does, a task's exception comes back
as its outcome (never lost on its thread), every thread is a daemon and is counted until it ends,
and an outcome that comes after the deadline is dropped without a trace on the caller."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest

from sentinel_cache.core.fanout import Fanout, run_all

GENEROUS = 10.0  # a correctness bound, far above any scheduling delay


def blocked_until(event: threading.Event, result: str) -> Callable[[], str]:
    def task() -> str:
        event.wait(GENEROUS)
        return result

    return task


def test_the_deadline_is_kept_and_a_late_task_is_reported_unanswered() -> None:
    release = threading.Event()
    fanout = Fanout(
        {"fast": lambda: "fast done", "slow": blocked_until(release, "slow done")},
        name="sentinel_cache-test-fanout-deadline",
    )
    try:
        began = time.monotonic()
        outcomes = fanout.outcomes(began + 0.2, lambda key: TimeoutError(f"{key}: no answer"))
        waited = time.monotonic() - began
        assert outcomes["fast"] == "fast done"
        assert (
            isinstance(outcomes["slow"], TimeoutError)
            and str(outcomes["slow"]) == "slow: no answer"
        )
        assert list(outcomes) == ["fast", "slow"]  # the tasks' order, not the arrival order
        assert 0.2 <= waited < 0.2 + GENEROUS / 2  # waited for the slow one, up to the deadline
        assert fanout.running == 1
    finally:
        release.set()
    # The late task ends on its own: counted until then, its outcome dropped with the inbox.
    assert fanout.join(GENEROUS)
    assert fanout.running == 0


def test_run_all_maps_every_key_and_names_what_timed_out() -> None:
    release = threading.Event()
    try:
        outcomes = run_all(
            {1: lambda: 10, 2: blocked_until(release, "late")},
            time.monotonic() + 0.1,
            "test-probes",
        )
    finally:
        release.set()
    assert outcomes[1] == 10
    assert isinstance(outcomes[2], TimeoutError)
    assert "test-probes" in str(outcomes[2])


def test_an_exception_is_carried_back_not_lost_on_the_thread(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    unhandled: list[threading.ExceptHookArgs] = []
    monkeypatch.setattr(threading, "excepthook", unhandled.append)
    refused = ConnectionRefusedError("nobody listens")

    def fails() -> None:
        raise refused

    def exits() -> None:
        raise SystemExit(7)  # a BaseException too: reported, not swallowed by the thread

    fanout = Fanout({"refused": fails, "exits": exits}, name="sentinel_cache-test-fanout-raise")
    outcomes = fanout.outcomes(time.monotonic() + GENEROUS, lambda key: TimeoutError(key))
    assert outcomes["refused"] is refused
    assert isinstance(outcomes["exits"], SystemExit) and outcomes["exits"].code == 7
    assert fanout.join(GENEROUS)
    assert unhandled == []  # nothing reached threading.excepthook: each failure was handed back


def test_every_thread_is_a_daemon_and_accounted_for() -> None:
    release = threading.Event()
    name = "sentinel_cache-test-fanout-threads"
    fanout = Fanout({n: blocked_until(release, str(n)) for n in range(4)}, name=name)
    try:
        mine = [t for t in threading.enumerate() if t.name == name]
        assert len(mine) == 4
        assert all(t.daemon for t in mine)  # a hung node never keeps the process alive
        assert fanout.running == 4
        assert fanout.collect(time.monotonic() + 0.05) == []
    finally:
        release.set()
    assert fanout.join(GENEROUS)
    assert fanout.running == 0
    assert [t for t in threading.enumerate() if t.name == name] == []
    # What arrived after the first collect is there for a later one, in order of arrival.
    assert sorted(fanout.collect(time.monotonic())) == [(n, str(n)) for n in range(4)]


def test_enough_stops_the_wait_early_with_the_outcomes_in_order_of_arrival() -> None:
    release = threading.Event()
    second = threading.Event()

    def first() -> str:
        return "a"

    def then() -> str:
        second.wait(GENEROUS)
        return "b"

    fanout = Fanout(
        {"a": first, "b": then, "never": blocked_until(release, "c")},
        name="sentinel_cache-test-fanout-enough",
    )
    try:
        got = fanout.collect(time.monotonic() + GENEROUS, enough=lambda so_far: len(so_far) >= 1)
        assert got == [("a", "a")]
        second.set()
        began = time.monotonic()
        got = fanout.collect(began + GENEROUS, enough=lambda so_far: len(so_far) >= 2)
        assert got == [("a", "a"), ("b", "b")]
        assert time.monotonic() - began < GENEROUS / 2  # it did not wait for "never"
    finally:
        release.set()
    assert fanout.join(GENEROUS)


def test_a_thread_that_cannot_start_is_that_task_s_outcome(monkeypatch: pytest.MonkeyPatch) -> None:
    real_start = threading.Thread.start
    starts: list[str] = []

    def start(thread: threading.Thread) -> None:
        starts.append(thread.name)
        if len(starts) == 2:
            raise RuntimeError("can't start new thread")
        real_start(thread)

    monkeypatch.setattr(threading.Thread, "start", start)
    fanout = Fanout(
        {"a": lambda: 1, "b": lambda: 2, "c": lambda: 3}, name="sentinel_cache-test-start"
    )
    outcomes = fanout.outcomes(time.monotonic() + GENEROUS, lambda key: TimeoutError(key))
    assert outcomes["a"] == 1 and outcomes["c"] == 3
    assert isinstance(outcomes["b"], RuntimeError)
    assert fanout.join(GENEROUS)
    assert fanout.running == 0  # the one never started is not counted as running
