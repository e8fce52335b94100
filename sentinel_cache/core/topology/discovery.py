"""Finding each shard's master (and replicas) through the sentinels.

Follows the Redis "Sentinel client guidelines": short timeouts, every sentinel asked, a null reply
means "ask the next", ``ROLE`` verifies the answer, the sentinel that answered first goes to the
front, sentinels learned from ``SENTINEL SENTINELS`` are added. All sentinels are asked at once,
with one pipelined round trip each, so a black-holed sentinel costs one timeout per round, not
one per shard.

Credentials and TLS are kept apart: the sentinels get ``sentinel_kwargs``, the data nodes (``ROLE``
checks included) get the data nodes' ``connection_kwargs``. A rejected password, an ACL user
without permission or a failed TLS verification cannot be fixed by asking again, so it ends a
name's resolution at once with an :class:`~sentinel_cache.AuthenticationFailedError` that says
which side rejected what (and never contains a secret), instead of retrying until the timeout.

The sentinels themselves and one round of asking them are in
:mod:`~sentinel_cache.core.topology.sentinels`, the reading of their replies in
:mod:`~sentinel_cache.core.topology.replies`; this module decides what the answers mean.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import redis

from sentinel_cache.core.config import Address
from sentinel_cache.core.options import did_you_mean
from sentinel_cache.core.throttle import Throttle
from sentinel_cache.core.topology.replies import (
    HINTS,
    VERBS,
    credential_failure,
    data_node_refusal,
    direct_client,
    reply_text,
    secret_values,
    summarize_failures,
)
from sentinel_cache.core.topology.replies import SentinelReply as SentinelReply
from sentinel_cache.core.topology.replies import config_epoch as config_epoch
from sentinel_cache.core.topology.replies import instance_healthy as instance_healthy
from sentinel_cache.core.topology.replies import redact as redact
from sentinel_cache.core.topology.replies import refusal as refusal
from sentinel_cache.core.topology.replies import reply_address as reply_address
from sentinel_cache.core.topology.replies import reply_fields as reply_fields
from sentinel_cache.core.topology.sentinels import MAX_SENTINELS as MAX_SENTINELS
from sentinel_cache.core.topology.sentinels import SentinelSet as SentinelSet
from sentinel_cache.exceptions import (
    AuthenticationFailedError,
    ConflictingMasterError,
    DataNodeAuthenticationError,
    MasterNotFoundError,
    NoSentinelReachableError,
    ReplyProtocolError,
    SentinelAuthenticationError,
)

logger = logging.getLogger("sentinel_cache")


@dataclass(frozen=True)
class Resolution:
    """The master of one shard, how many sentinels named it, and the evidence for it.

    ``epoch`` is the sentinels' config epoch for that master (0 when they would not say) and
    ``asked_at`` the monotonic time the sentinels were asked: a shard only takes an answer newer
    than the one it holds, so a slow answer can never undo a newer switch. ``verified`` is False
    when the sentinels still name the node the caller reported failing: it was not asked for its
    ``ROLE`` (that would wait a second timeout on a hung node), and nothing changes.
    ``named_by`` are the sentinels that named the address, of ``asked`` asked.
    """

    name: str
    address: Address
    replicas: tuple[Address, ...]
    agreeing: int
    answered: int
    epoch: int = 0
    asked_at: float = 0.0
    verified: bool = True
    named_by: tuple[Address, ...] = ()
    asked: int = 0

    @property
    def majority(self) -> bool:
        """More than half of the sentinels asked (not only of those that answered) named it."""
        return self.agreeing > self.asked // 2


def check_role(address: Address, connection_kwargs: Mapping[str, Any]) -> str:
    """``ROLE`` of the node at ``address`` ("master", "slave", ...), with the data nodes' options."""
    client = direct_client(address, connection_kwargs)
    try:
        try:
            role = client.execute_command("ROLE")
        except (AttributeError, TypeError, KeyError, IndexError, ValueError) as exc:
            # redis-py's handshake met a reply of the wrong kind (``+OK`` for HELLO's map)
            raise ReplyProtocolError(
                f"the node at {address} answered the connection handshake with a reply of "
                f"the wrong kind ({type(exc).__name__}: {exc})"
            ) from exc
        if not isinstance(role, (list, tuple)) or not role or not isinstance(role[0], (bytes, str)):
            raise redis.ResponseError(f"malformed ROLE reply: {role!r:.80}")
        return reply_text(role[0])
    finally:
        client.close()
        client.connection_pool.disconnect()


#: At most this many monitored names are listed in a "did you mean".
SHOWN_NAMES = 10


def monitored_hint(name: str, monitored: Iterable[str]) -> str:
    """``"; they monitor: 'a', 'b'; did you mean 'a'?"`` for a master name no sentinel monitors:
    one wording for the system check, ``sentinel_status`` and the error at run time."""
    known = sorted(set(monitored))
    if not known:
        return ""
    shown = ", ".join(map(repr, known[:SHOWN_NAMES]))
    more = f" and {len(known) - SHOWN_NAMES} more" if len(known) > SHOWN_NAMES else ""
    return f"; they monitor: {shown}{more}{did_you_mean(name, known)}"


#: ``claimant(name, address, majority)``: why ``address`` may not be the master of ``name``
#: (another shard is on it, or was), or None; ``majority``: most sentinels asked named it.
Claimant = Callable[[str, Address, bool], "str | None"]

#: A refused answer is logged once per this many seconds per master name and node.
CONFLICT_LOG_INTERVAL = 10.0


class Discovery:
    """Resolves master names to verified master addresses, retrying for a bounded time.

    One node, one shard: a candidate that ``claimant`` (the core's rule for the nodes its
    shards are or were on) refuses, or that the same round's sentinels name for another master
    at least as often, is skipped for the next candidate, with a warning naming both masters
    and the sentinels that named it; with no candidate left the name fails with a
    :class:`~sentinel_cache.ConflictingMasterError` and is asked again.
    """

    def __init__(
        self,
        sentinels: SentinelSet,
        connection_kwargs: Mapping[str, Any],
        *,
        timeout: float,
        replicas: bool = False,
        claimant: Claimant | None = None,
    ) -> None:
        self.sentinels = sentinels
        self._connection_kwargs = dict(connection_kwargs)
        self._secrets = secret_values(self._connection_kwargs) + sentinels.secrets
        self._timeout = timeout
        self._replicas = replicas
        self._claimant = claimant
        self._conflict_logs: dict[tuple[str, Address], Throttle] = {}

    def __repr__(self) -> str:
        return f"<Discovery sentinels={self.sentinels!r} timeout={self._timeout}s>"

    @property
    def secrets(self) -> tuple[str, ...]:
        """The passwords of both sides, for :func:`redact`."""
        return self._secrets

    def resolve(
        self,
        masters: Sequence[str],
        *,
        timeout: float | None = None,
        suspects: Mapping[str, Address] | None = None,
    ) -> dict[str, Resolution | BaseException]:
        """Resolve every name; a name that could not be resolved in time maps to its error.

        ``suspects`` maps a name to the node the caller just saw fail: if the sentinels still
        name it, the answer is an unverified :class:`Resolution` instead of a ``ROLE`` check
        that would wait on that node again.
        """
        deadline = time.monotonic() + (self._timeout if timeout is None else timeout)
        pending = list(masters)
        results: dict[str, Resolution | BaseException] = {}
        suspects = suspects or {}
        settled: dict[str, Address] = {}  # found so far by this call, not yet taken by a shard
        delay = 0.05
        wait: float | None = None  # the first round waits as long as a round does
        while True:
            asked_at = time.monotonic()
            replies = self.sentinels.ask_all(pending, replicas=self._replicas, wait=wait)
            self._remember(replies)
            # Every sentinel refusing our credentials (or certificates) will not change by
            # asking again; neither will a data node refusing them: fail now, not at the deadline.
            all_refused = bool(replies) and all(credential_failure(r.error) for r in replies)
            # Every sentinel answered and none monitors a name: asking again will not change it.
            all_answered = bool(replies) and all(r.error is None for r in replies)
            for name in list(pending):
                outcome = self.pick(name, replies, asked_at, suspects.get(name), settled)
                results[name] = outcome
                if isinstance(outcome, Resolution):
                    settled[name] = outcome.address
                unknown = all_answered and all(r.masters.get(name) is None for r in replies)
                if unknown and isinstance(outcome, MasterNotFoundError):
                    results[name] = MasterNotFoundError(
                        f"{outcome}{monitored_hint(name, self._monitored(replies))}"
                    )
                if (
                    isinstance(outcome, Resolution)
                    or unknown
                    or (
                        isinstance(outcome, AuthenticationFailedError)
                        and (all_refused or isinstance(outcome, DataNodeAuthenticationError))
                    )
                ):
                    pending.remove(name)
            if not pending or time.monotonic() + delay >= deadline:
                if timeout is None:
                    self._name_the_wait(pending, results)
                return results
            time.sleep(delay * random.uniform(0.8, 1.2))
            delay = min(delay * 2, 0.5)
            # A later round ends by the deadline: it waits only what is left of it.
            wait = max(0.0, min(self.sentinels.round_wait, deadline - time.monotonic()))

    def _monitored(self, replies: Sequence[SentinelReply]) -> list[str]:
        """The master names the first answering sentinel monitors (SENTINEL MASTERS), asked
        only for a name none monitors, so the error can say which was meant."""
        for reply in replies:
            try:
                listing = self.sentinels.client(reply.sentinel).execute_command(
                    "SENTINEL", "MASTERS"
                )
                return [reply_fields(item)["name"] for item in listing or ()]
            except (redis.RedisError, OSError, KeyError, TypeError, IndexError):
                continue
        return []

    def _name_the_wait(
        self, pending: Sequence[str], results: dict[str, Resolution | BaseException]
    ) -> None:
        """No sentinel answered within DISCOVERY_TIMEOUT: say which were asked (the adapters'
        LOCATION) and for how long, so a wrong address or port explains itself."""
        asked = ", ".join(map(str, self.sentinels.addresses))
        for name in pending:
            outcome = results.get(name)
            if isinstance(outcome, NoSentinelReachableError):
                results[name] = NoSentinelReachableError(
                    f"{outcome}; no sentinel of LOCATION ({asked}) answered within "
                    f"DISCOVERY_TIMEOUT ({self._timeout:g} s)"
                )

    def _remember(self, replies: Sequence[SentinelReply]) -> None:
        self.sentinels.note_rejections(replies)
        first = next((r for r in replies if r.error is None), None)
        if first is not None:
            self.sentinels.promote(first.sentinel)
        for reply in replies:
            if reply.error is None:
                self.sentinels.learn(reply.peers)

    def pick(
        self,
        name: str,
        replies: Sequence[SentinelReply],
        asked_at: float = 0.0,
        suspect: Address | None = None,
        settled: Mapping[str, Address] | None = None,
    ) -> Resolution | BaseException:
        """The master of ``name`` from the sentinels' replies (I/O: the candidates' ``ROLE``):
        the newest config epoch wins, then the most votes, then the earliest answer; a node
        another master holds is never a candidate (see the class). ``settled`` are the masters
        of other names found so far by the same :meth:`resolve`."""
        answered = [r for r in replies if r.error is None]
        if not answered:
            summary = summarize_failures(replies, name, self._secrets)
            kinds = [k for r in replies if (k := credential_failure(r.error)) is not None]
            if kinds:
                kind = max(set(kinds), key=kinds.count)
                return SentinelAuthenticationError(
                    f"master {name!r}: the sentinels {VERBS[kind]} "
                    f"({len(kinds)} of {len(replies)}; {summary}); {HINTS[kind, 'sentinel']}"
                )
            return NoSentinelReachableError(f"master {name!r}: no sentinel reachable ({summary})")
        votes: dict[Address, int] = {}
        epochs: dict[Address, int] = {}
        for reply in answered:
            address = reply.masters.get(name)
            if address is not None:
                votes[address] = votes.get(address, 0) + 1
                epochs[address] = max(epochs.get(address, 0), reply.epochs.get(name, 0))
        if not votes:
            return MasterNotFoundError(
                f"master {name!r}: no sentinel monitors this name "
                f"({summarize_failures(replies, name, self._secrets)})"
            )
        # The newest configuration first (Sentinel's own rule: a higher config epoch wins, so a
        # majority of sentinels that have not heard of a failover yet cannot undo it); then
        # most votes; among equals, the earliest answer (replies arrive in order). An address
        # from an older epoch than the newest is never a candidate: the node it names has been
        # replaced, even if it still answers ROLE "master" (an old master back from a partition).
        order = {address: i for i, address in reversed(list(_arrivals(answered, name)))}
        newest = max(epochs.values())
        candidates = sorted(
            (a for a in votes if epochs[a] == newest),
            key=lambda a: (-votes[a], order[a]),
        )
        failures = []
        refused: list[DataNodeAuthenticationError] = []
        conflicts: list[str] = []
        for address in candidates:
            named_by = tuple(r.sentinel for r in answered if r.masters.get(name) == address)
            taken = self._taken(name, address, votes[address], len(replies), answered, settled)
            if taken is not None:
                conflicts.append(
                    f"sentinel{'s' * (len(named_by) > 1)} {', '.join(map(str, named_by))} "
                    f"named {address}, {taken}"
                )
                self._warn_conflict(name, address, conflicts[-1])
                continue
            if address == suspect:
                if address == candidates[0]:
                    return Resolution(
                        name,
                        address,
                        (),
                        votes[address],
                        len(answered),
                        newest,
                        asked_at,
                        False,
                        named_by,
                        len(replies),
                    )
                continue
            try:
                role = check_role(address, self._connection_kwargs)
            except (redis.RedisError, OSError) as exc:
                refusal = data_node_refusal(exc, f"master {name!r}", address, self._secrets)
                if refusal is not None:
                    refused.append(refusal)
                failures.append(
                    f"{address}: {redact(f'{type(exc).__name__}: {exc}', self._secrets)}"
                )
                continue
            if role == "master":
                replicas = next(
                    (tuple(r.replicas.get(name, ())) for r in answered if r.replicas.get(name)),
                    (),
                )
                return Resolution(
                    name,
                    address,
                    replicas,
                    votes[address],
                    len(answered),
                    newest,
                    asked_at,
                    True,
                    named_by,
                    len(replies),
                )
            failures.append(f"{address}: ROLE is {role!r}, not master")
        if refused:  # the same credentials go to every candidate: that is the problem
            return refused[0]
        if conflicts and not failures:
            return ConflictingMasterError(
                redact(f"master {name!r}: refused, {'; '.join(conflicts)}", self._secrets)
            )
        failures = conflicts + failures
        return MasterNotFoundError(
            f"master {name!r}: sentinels named {', '.join(map(str, candidates))} but none is a "
            f"reachable master ({'; '.join(failures)})"
        )

    def _taken(
        self,
        name: str,
        address: Address,
        votes: int,
        asked: int,
        answered: Sequence[SentinelReply],
        settled: Mapping[str, Address] | None,
    ) -> str | None:
        """Why ``address`` may not be the master of ``name``, or None (the class's rule)."""
        for other, found in (settled or {}).items():
            if other != name and found == address:
                return f"which the sentinels named for {other!r} earlier in this discovery"
        rivals: dict[str, list[Address]] = {}
        for reply in answered:
            for other, named in reply.masters.items():
                if other != name and named == address:
                    rivals.setdefault(other, []).append(reply.sentinel)
        for other, by in rivals.items():
            if len(by) >= votes:
                return (
                    f"which sentinel{'s' * (len(by) > 1)} {', '.join(map(str, by))} "
                    f"name{'s' * (len(by) == 1)} for {other!r}"
                )
        if self._claimant is not None:
            return self._claimant(name, address, votes > asked // 2)
        return None

    def _warn_conflict(self, name: str, address: Address, text: str) -> None:
        throttle = self._conflict_logs.setdefault((name, address), Throttle(CONFLICT_LOG_INTERVAL))
        throttle.warn(
            logger,
            "master %r: refusing an answer that would put two shards on one node: %s",
            name,
            redact(text, self._secrets),
        )


def _arrivals(replies: Sequence[SentinelReply], name: str) -> list[tuple[int, Address]]:
    return [
        (i, address)
        for i, reply in enumerate(replies)
        if (address := reply.masters.get(name)) is not None
    ]
