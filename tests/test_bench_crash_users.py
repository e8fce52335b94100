"""The counting of :mod:`benchmarks.crash_users` (the crash benchmark itself is not in
``make test``): what makes a request a 500, another failure, a logout or a stale read, and which
line of a server's log a 500's cause is."""

from __future__ import annotations

from benchmarks.crash_users import Request, logged_causes, tally


def test_tally_counts_each_kind_of_outcome_once() -> None:
    requests = [
        Request(0, -1.0, -0.9, 200),
        Request(0, 0.1, 0.2, 500),
        Request(1, 0.3, 1.5, 500),
        Request(1, 0.5, 0.6, 503),
        Request(2, 0.7, 30.7, 0, error="TimeoutError: timed out"),
        Request(3, 1.0, 1.1, 200, logged_out=True),
        Request(3, 1.2, 1.3, 200, logged_out=True),
        Request(4, 2.0, 2.1, 200, new_cookie=True),
        Request(5, 3.0, 3.1, 200, stale=True),
    ]
    t = tally(requests, switch_s=2.5)
    assert t.requests == 9
    assert t.after_kill == 7  # began at 0 <= t < 2.5
    assert t.status_500 == 2
    assert (t.first_500_s, t.last_500_s) == (0.1, 1.5)
    assert dict(t.other_failures) == {"HTTP 503": 1, "TimeoutError: timed out": 1}
    assert t.failures == 4
    assert (t.logouts, t.users_logged_out) == (3, 2)
    assert t.stale == 1
    assert t.slowest_s == 30.0


def test_a_clean_round_counts_nothing() -> None:
    t = tally([Request(n, 0.0, 0.01, 200) for n in range(50)], switch_s=2.0)
    assert (t.failures, t.logouts, t.stale, t.first_500_s) == (0, 0, 0, None)


def test_a_500s_cause_is_the_last_exception_of_its_traceback() -> None:
    log = """Internal Server Error: /page
Traceback (most recent call last):
  File "x.py", line 1, in f
ConnectionRefusedError: [Errno 111] Connection refused

During handling of the above exception, another exception occurred:

redis.exceptions.ConnectionError: Error 111 connecting to 127.0.0.1:1. Connection refused.

The above exception was the direct cause of the following exception:

Traceback (most recent call last):
sentinel_cache.exceptions.ShardUnavailableError: shard 0 (shard0) at 127.0.0.1:1: refused
[2026-12-06 22:00:00 +0000] [1] [INFO] Booting worker with pid: 2
"""
    assert logged_causes(log + log) == {
        "sentinel_cache.exceptions.ShardUnavailableError: shard 0 (shard0) at 127.0.0.1:1: refused": 2
    }
