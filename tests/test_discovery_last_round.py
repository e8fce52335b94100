"""Discovery's error when its last round runs out of time: the sentinels answered in earlier
rounds (naming a node that is no master), then one round timed out just before the deadline.
The error must say what the answers said, not "no sentinel reachable" (a full run on a loaded
machine reported the garbage-handshake master as ``no answer within 0.00s``). A stub sentinel
set stands in for the sentinels: the rounds' timing is what is under test, not their I/O."""

from __future__ import annotations

import socket
from collections.abc import Sequence
from typing import Any

from sentinel_cache import MasterNotFoundError
from sentinel_cache.core.addresses import Address
from sentinel_cache.core.topology.discovery import Discovery, SentinelReply

SENTINEL = Address("127.0.0.1", 1)


def closed_port() -> int:
    """A loopback port nobody listens on: the named master refuses every connection."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class AnswersThenTimesOut:
    """Answers the first ``answers`` rounds naming ``master``, then times out every round."""

    def __init__(self, master: Address, answers: int) -> None:
        self.master, self.answers, self.rounds = master, answers, 0
        self.addresses = [SENTINEL]
        self.round_wait = 0.05
        self.secrets: tuple[str, ...] = ()

    def __repr__(self) -> str:
        return f"<AnswersThenTimesOut rounds={self.rounds}>"

    def ask_all(
        self, masters: Sequence[str], *, replicas: bool = False, wait: float | None = None
    ) -> list[SentinelReply]:
        self.rounds += 1
        if self.rounds <= self.answers:
            return [SentinelReply(SENTINEL, masters=dict.fromkeys(masters, self.master))]
        return [SentinelReply(SENTINEL, error=TimeoutError("no answer within 0.00s"))]

    def note_rejections(self, replies: Any) -> None:
        pass

    def promote(self, sentinel: Any) -> None:
        pass

    def learn(self, peers: Any) -> None:
        pass


def test_a_last_round_that_timed_out_does_not_hide_what_the_sentinels_said() -> None:
    sentinels = AnswersThenTimesOut(Address("127.0.0.1", closed_port()), answers=2)
    discovery = Discovery(sentinels, {"socket_timeout": 0.2}, timeout=0.5)  # type: ignore[arg-type]
    outcome = discovery.resolve(["shard_a"])["shard_a"]
    assert sentinels.rounds > 2, sentinels  # the later rounds did time out
    assert isinstance(outcome, MasterNotFoundError), repr(outcome)
    assert "shard_a" in str(outcome)
