"""A master (or a proxy in front of one) answering garbage costs one call about one
``SOCKET_TIMEOUT`` at most, never the whole process, and the error names the shard and address.

Before the fix a ``*2147483647`` reply made hiredis allocate an array of 2**31 slots, and
freeing it (when the connection was dropped and its reader went) held the interpreter's lock
for seconds: every thread stopped (27 s for one call's process here, 11.5-39 s in the issue's
trial). Handshake replies of the wrong kind escaped as ``AttributeError`` and garbage as a raw
``redis.InvalidResponse``, naming no shard. The master here is a fake (a loopback server
answering what the test scripts), as a hostile server must be; so is its sentinel.
"""

from __future__ import annotations

import asyncio
import gc
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from threads import Workers

from sentinel_cache import MasterNotFoundError, ReplyProtocolError, ShardUnavailableError
from sentinel_cache.core.ops.aio import AsyncCacheClient
from sentinel_cache.core.ops.client import CacheClient
from sentinel_cache.core.serializers import Codec
from sentinel_cache.core.topology.lean_rules import (
    LINE_START,
    MAX_REPLY_ELEMENTS,
    overfull,
    oversized,
)
from sentinel_cache.core.topology.sharded_pool import ShardedSentinelPool
from sentinel_cache.testing.fake_sentinel import FakeSentinel, Raw, Script

SOCKET_TIMEOUT = 1.0
BOUND = 1.5 * SOCKET_TIMEOUT  # what a hostile reply may cost one call (the brief's target)

MASTER: Script = {("ROLE",): ["master", 0, []], ("INFO",): "run_id:fake\r\n"}


def test_the_guard_finds_huge_headers_at_line_starts_even_cut_across_chunks() -> None:
    limit, fresh = 512 * 1024 * 1024, LINE_START  # a new connection's carry

    def hostile(data: bytes, carry: bytes = fresh) -> str | None:
        return oversized(data, len(data), carry, limit)[0]

    assert hostile(b"*2147483647\r\n") is not None
    assert hostile(b"*2\r\n$1\r\na\r\n%2147483647\r\n") is not None
    assert hostile(b"$600000000\r\n") is not None
    assert hostile(b"*" + b"9" * 10_000 + b"\r\n") is not None  # no 10,000-digit int made
    fits = b"*%d\r\n" % MAX_REPLY_ELEMENTS
    assert oversized(fits, len(fits), fresh, limit) == (None, LINE_START)
    assert oversized(b"$536870912\r\n", 12, fresh, limit) == (None, LINE_START)
    assert hostile(b"x*2147483647\r\n") is None  # not at a line's start
    assert hostile(b"*2147483647\r\n", carry=b"") is None  # the chunk began inside a line
    # A value holding a line that reads as a huge header is refused too (docs/reliability.md).
    assert hostile(b"$16\r\nab\r\n*123456789\r\n") is not None
    # Whole short lines (a write's usual reply), read into a larger buffer, are clean at once;
    # the shortest header looked at closer (8 digits and a bare line feed) is not that short.
    buffer = bytearray(64)
    for reply in (b"+OK\r\n", b":1\r\n", b"$-1\r\n", b":12345\r\n"):
        buffer[: len(reply)] = reply
        assert oversized(buffer, len(reply), fresh, limit) == (None, LINE_START), reply
    assert hostile(b">43872917\n") is not None
    # A reply item the parser holds more of than the master can hold is refused.
    assert overfull(limit + 2 * 1024 * 1024, 1024 * 1024) is not None
    assert overfull(limit, 1024 * 1024) is None
    assert overfull(2 * limit, 2 * limit) is None  # a master that allows more
    # A header dripped one byte per chunk, or cut anywhere, is still seen before its line ends.
    header = b"*2147483647\r\n"
    carry, found = fresh, None
    for byte in header:
        found, carry = oversized(bytes([byte]), 1, carry, limit)
        if found is not None:
            break
    assert found is not None
    for cut in range(1, len(header)):
        first, carry = oversized(header[:cut], cut, fresh, limit)
        second = oversized(header[cut:], len(header) - cut, carry, limit)[0]
        assert first is not None or second is not None, cut


@pytest.fixture
def hostile() -> Iterator[Callable[..., ShardedSentinelPool]]:
    """A core on a fake master answering ``script`` (with ``ROLE`` and ``INFO`` answered),
    found through a fake sentinel; everything closed after."""
    made: list[Any] = []

    def factory(script: Script, **options: Any) -> ShardedSentinelPool:
        master = FakeSentinel({**MASTER, **script})
        made.append(master)
        where = [master.address.host, str(master.address.port)]
        sentinel = FakeSentinel(
            {
                ("SENTINEL", "GET-MASTER-ADDR-BY-NAME"): where,
                ("SENTINEL", "SENTINELS"): [],
                ("SENTINEL", "REPLICAS"): [],
            }
        )
        made.append(sentinel)
        pool = ShardedSentinelPool(
            ["hostile"],
            [sentinel.address],
            listeners=False,
            socket_timeout=SOCKET_TIMEOUT,
            outage_hold=0,
            outage_reads=False,
            **options,
        )
        made.insert(0, pool)
        pool.discover()
        return pool

    yield factory
    for thing in made:
        thing.close()


class Stalls:
    """A worker that sleeps a millisecond at a time and records its longest gap: how long the
    rest of the process was stopped."""

    def __init__(self, workers: Workers) -> None:
        self.longest = 0.0
        self._stop = threading.Event()
        workers.spawn(self._run, name="stall-meter")

    def _run(self) -> None:
        last = time.monotonic()
        while not self._stop.is_set():
            time.sleep(0.001)
            now = time.monotonic()
            self.longest = max(self.longest, now - last)
            last = now

    def stop(self) -> None:
        self._stop.set()


def calls(flavour: str, pool: ShardedSentinelPool, times: int = 2) -> list[tuple[Any, float]]:
    """``get`` ``times`` times (the second on a new connection, the first one's reader freed):
    what each raised (or returned) and how long it took."""
    results: list[tuple[Any, float]] = []
    if flavour == "sync":
        client = CacheClient(pool, Codec())
        for _ in range(times):
            started = time.monotonic()
            try:
                outcome: Any = client.get("k")
            except Exception as exc:
                outcome = exc
            results.append((outcome, time.monotonic() - started))
            gc.collect()
        return results

    async def scenario() -> None:
        client = AsyncCacheClient(pool, Codec())
        try:
            for _ in range(times):
                started = time.monotonic()
                try:
                    outcome: Any = await client.get("k")
                except Exception as exc:
                    outcome = exc
                results.append((outcome, time.monotonic() - started))
                gc.collect()
        finally:
            await client.aclose()

    asyncio.run(scenario())
    return results


def names_the_shard(error: BaseException, pool: ShardedSentinelPool) -> None:
    shard = pool.shards[0]
    assert isinstance(error, ShardUnavailableError), repr(error)
    assert f"shard {shard.label}" in str(error) and str(shard.address) in str(error), error


HOSTILE = [
    pytest.param(b"*2147483647\r\n", True, id="huge-array"),
    pytest.param(b"*2\r\n$1\r\na\r\n*2147483647\r\n", True, id="huge-nested-array"),
    pytest.param(b"%2147483647\r\n", True, id="huge-map"),
    pytest.param(b"~99999999\r\n", True, id="huge-set"),
    pytest.param(b"$2147483647\r\n", True, id="huge-bulk"),
    pytest.param(b"?garbage\r\n", True, id="garbage"),
    pytest.param(b"$100\r\nabc", False, id="truncated-bulk"),  # then silence: one timeout
    # A huge bulk string inside a reply is not allocated before its bytes come (overfull bounds
    # those): here none come, so one timeout.
    pytest.param(b"*2\r\n$1\r\na\r\n$2147483647\r\n", False, id="huge-nested-bulk"),
]


@pytest.mark.parametrize("flavour", ["sync", "asyncio"])
@pytest.mark.parametrize(("reply", "protocol_error"), HOSTILE)
def test_a_hostile_reply_fails_the_call_within_a_timeout_and_stops_no_thread(
    hostile: Callable[..., ShardedSentinelPool], flavour: str, reply: bytes, protocol_error: bool
) -> None:
    pool = hostile({("GET",): Raw(reply)})
    workers = Workers(timeout=120)
    stalls = Stalls(workers)
    try:
        results = calls(flavour, pool)
        pool.close()  # every reader freed while the meter runs
        gc.collect()
    finally:
        stalls.stop()
        workers.join()
    for error, elapsed in results:
        names_the_shard(error, pool)
        if protocol_error:
            assert isinstance(error.__cause__, ReplyProtocolError), repr(error.__cause__)
            names_the_shard(error.__cause__, pool)
        assert elapsed < BOUND, f"{elapsed:.2f} s"
    print(
        f"\n{flavour} {reply[:20]!r}: calls {[round(e, 3) for _, e in results]} s, "
        f"longest stall of another thread {stalls.longest * 1000:.0f} ms"
    )
    assert stalls.longest < SOCKET_TIMEOUT, f"another thread stopped {stalls.longest:.2f} s"


HELLO_MASTER = {"server": "redis", "version": "7.0.0", "proto": 3, "role": "master", "modules": []}


def later(good: Any, bad: Any, word: bytes) -> Callable[[list[bytes]], Any]:
    """A reply: ``good`` to the first command whose first argument is ``word`` (the discovery's
    ``ROLE`` check connects first), ``bad`` to every later one, as a proxy gone bad would."""
    seen: list[bytes] = []

    def reply(args: list[bytes]) -> Any:
        if args[0].upper() != word and (len(args) < 2 or args[1].upper() != word):
            return Raw(b"+OK\r\n")
        seen.append(word)
        return good if len(seen) == 1 else bad

    return reply


GARBAGE_HANDSHAKES = [
    pytest.param("HELLO", Raw(b"+OK\r\n"), {"protocol": 3}, id="hello-answered-ok"),
    pytest.param("HELLO", Raw(b":42\r\n"), {"protocol": 3}, id="hello-answered-42"),
    pytest.param("HELLO", Raw(b"?junk\r\n"), {"protocol": 3}, id="hello-answered-junk"),
    pytest.param("CLIENT", Raw(b":42\r\n"), {"client_name": "app"}, id="setname-answered-42"),
]


def handshake_script(command: str, bad: Any, *, from_the_start: bool = False) -> Script:
    if command == "HELLO":
        good: Any = bad if from_the_start else HELLO_MASTER
        return {("HELLO",): later(good, bad, b"HELLO")}
    good = bad if from_the_start else "OK"
    return {("CLIENT",): later(good, bad, b"SETNAME")}


@pytest.mark.parametrize("flavour", ["sync", "asyncio"])
@pytest.mark.parametrize(("command", "bad", "options"), GARBAGE_HANDSHAKES)
def test_garbage_in_the_handshake_is_a_protocol_error_naming_the_shard(
    hostile: Callable[..., ShardedSentinelPool],
    flavour: str,
    command: str,
    bad: Any,
    options: dict[str, Any],
) -> None:
    pool = hostile(handshake_script(command, bad), **options)
    ((error, elapsed),) = calls(flavour, pool, times=1)
    names_the_shard(error, pool)
    assert isinstance(error.__cause__, ReplyProtocolError), repr(error.__cause__)
    # a reply of the wrong kind is told as such; bytes that are no reply at all, as those
    assert "handshake" in str(error.__cause__) or "no reply" in str(error.__cause__)
    names_the_shard(error.__cause__, pool)
    assert elapsed < BOUND


@pytest.mark.parametrize(("command", "bad", "options"), GARBAGE_HANDSHAKES)
def test_garbage_in_the_handshake_at_discovery_names_the_master_and_node(
    hostile: Callable[..., ShardedSentinelPool], command: str, bad: Any, options: dict[str, Any]
) -> None:
    # (DISCOVERY_TIMEOUT 3 s: discovery asks again until then, and a loaded machine needs it)
    with pytest.raises(MasterNotFoundError) as raised:
        hostile(
            handshake_script(command, bad, from_the_start=True), discovery_timeout=3.0, **options
        )
    assert "master 'hostile'" in str(raised.value) and "127.0.0.1:" in str(raised.value)
