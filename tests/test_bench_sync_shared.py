"""benchmarks/sync_shared.py's hand-written clients, against a real server: each thread gets its
own replies back, so the shared connections' figures are not those of a broken client (replies
handed to the wrong caller would look just as fast)."""

from __future__ import annotations

import hiredis
import pytest
import redis
from threads import Workers

from benchmarks.contender import Topology
from benchmarks.sync_shared import PerThread, SharedLeader, SharedReader
from sentinel_cache.testing import LocalSentinelCluster

THREADS = 8
CALLS = 1000  # per thread: SETs of unique values, GETs of them, now and then an error reply
KEYS = 20  # per thread


@pytest.mark.parametrize("kind", [SharedLeader, SharedReader, PerThread])
def test_every_thread_reads_back_its_own_values_and_errors(
    cluster: LocalSentinelCluster, kind: type[PerThread | SharedLeader | SharedReader]
) -> None:
    address = Topology.of(cluster).master_addresses[0]
    client = kind(address)
    seen: list[int] = [0] * THREADS

    def work(index: int) -> None:
        text = f"sync-shared-test:{kind.__name__}:{index}:text"
        assert client.set(text, "not a number") is True
        latest: dict[str, tuple[int, int]] = {}
        for call in range(CALLS):
            key = f"sync-shared-test:{kind.__name__}:{index}:{call % KEYS}"
            if call % 97 == 0:  # an error reply reaches its caller and no other
                command = b"*2\r\n$4\r\nINCR\r\n" + b"$%d\r\n%b\r\n" % (len(text), text.encode())
                with pytest.raises(hiredis.ReplyError, match="not an integer"):
                    client.call(command)
            elif call % 2 == 0 or key not in latest:
                latest[key] = (index, call)
                assert client.set(key, latest[key]) is True
            else:
                assert client.get(key) == latest[key], (index, call, key)
            seen[index] += 1

    try:
        with Workers(timeout=60) as workers:
            for index in range(THREADS):
                workers.spawn(work, index, name=f"sync-shared-{index}")
        assert seen == [CALLS] * THREADS
        if isinstance(client, (SharedLeader, SharedReader)):
            assert client.failed is None
            assert not client.waiting and not client.out
            assert client.batches <= THREADS * (CALLS + 1)  # never more writes than calls
    finally:
        client.close()
    if isinstance(client, SharedReader):
        assert not client.reader.is_alive()  # close() ends and joins the reader thread
    with redis.Redis(host=address[0], port=address[1]) as plain:  # the values are on the server
        assert plain.exists(f"sync-shared-test:{kind.__name__}:0:0") == 1


def test_a_shared_connection_that_fails_fails_its_waiting_calls(
    cluster: LocalSentinelCluster,
) -> None:
    """The server closes the shared connection: the calls in flight raise, none hangs, and later
    calls are refused instead of reading someone else's reply."""
    address = Topology.of(cluster).master_addresses[0]
    for kind in (SharedLeader, SharedReader):
        client = kind(address)
        try:
            assert client.set("sync-shared-test:fail", 1) is True
            ident = client.call(b"*2\r\n$6\r\nCLIENT\r\n$2\r\nID\r\n")
            with redis.Redis(host=address[0], port=address[1]) as plain:
                assert plain.execute_command("CLIENT", "KILL", "ID", ident) == 1
            with pytest.raises((ConnectionError, OSError)):
                for _ in range(3):  # the first call may be written before the close is seen
                    client.get("sync-shared-test:fail")
            with pytest.raises((ConnectionError, OSError)):
                client.get("sync-shared-test:fail")
            assert not client.waiting
        finally:
            client.close()
