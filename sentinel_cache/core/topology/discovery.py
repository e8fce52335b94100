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
"""

from __future__ import annotations

import functools
import logging
import random
import ssl
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import redis
from redis.exceptions import AuthenticationWrongNumberOfArgsError, NoPermissionError

from sentinel_cache.core.config import Address, connection_class_and_kwargs
from sentinel_cache.core.fanout import Fanout
from sentinel_cache.core.throttle import Throttle
from sentinel_cache.exceptions import (
    AuthenticationFailedError,
    ConflictingMasterError,
    DataNodeAuthenticationError,
    MasterNotFoundError,
    NoSentinelReachableError,
    SentinelAuthenticationError,
)

logger = logging.getLogger("sentinel_cache")


@dataclass
class SentinelReply:
    """What one sentinel said in one round: per master, its address, replicas and peers."""

    sentinel: Address
    masters: dict[str, Address | None] = field(default_factory=dict)
    epochs: dict[str, int] = field(default_factory=dict)
    replicas: dict[str, list[Address]] = field(default_factory=dict)
    peers: list[Address] = field(default_factory=list)
    error: BaseException | None = None
    elapsed: float = 0.0


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


def reply_text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def reply_fields(reply: Any) -> dict[str, str]:
    """A sentinel's per-instance reply: a flat list, or a dict once redis-py has parsed it."""
    if isinstance(reply, Mapping):
        return {reply_text(k): reply_text(v) for k, v in reply.items()}
    return {reply_text(reply[i]): reply_text(reply[i + 1]) for i in range(0, len(reply) - 1, 2)}


def instance_healthy(info: Mapping[str, str]) -> bool:
    flags = set(info.get("flags", "").split(","))
    return not flags & {"s_down", "o_down", "disconnected"}


def reply_address(host: Any, port: Any) -> Address:
    """An address from a sentinel's reply; ValueError unless it is a plausible one, so a garbled
    reply costs that sentinel its answer instead of breaking a ROLE check."""
    text = reply_text(host)
    if not text or len(text) > 253 or not text.isprintable() or " " in text:
        raise ValueError(f"malformed host {text[:64]!r}")
    number = int(port)
    if not 1 <= number <= 65535:
        raise ValueError(f"port out of range: {number}")
    return Address(text, number)


# Learned sentinels beyond this are ignored: a broken sentinel may list thousands of "peers",
# and every round asks every known sentinel (a thread each) and runs a listener for each.
MAX_SENTINELS = 16


# A connection dropped in the middle of a handshake is not a verdict on our certificates.
_TRANSIENT_SSL_ERRORS = (
    ssl.SSLEOFError,
    ssl.SSLZeroReturnError,
    ssl.SSLSyscallError,
    ssl.SSLWantReadError,
    ssl.SSLWantWriteError,
)
_CREDENTIAL_CODES = ("NOAUTH", "WRONGPASS", "NOPERM")

#: What to check, per kind of rejection and side.
_HINTS = {
    ("credentials", "data node"): "check the data nodes' USERNAME/PASSWORD (connection kwargs), "
    "which are separate from SENTINEL_USERNAME/SENTINEL_PASSWORD",
    ("credentials", "sentinel"): "check SENTINEL_USERNAME/SENTINEL_PASSWORD (sentinel_kwargs), "
    "which are separate from the data nodes' USERNAME/PASSWORD",
    ("permission", "data node"): "the data nodes' ACL user needs at least +role and the cache's "
    "commands",
    ("permission", "sentinel"): "the sentinels' ACL user needs +sentinel|get-master-addr-by-name, "
    "+sentinel|sentinels, +sentinel|replicas and +subscribe",
    ("tls", "data node"): "check SSL, SSL_CA_CERTS, SSL_CERTFILE/SSL_KEYFILE and "
    "SSL_CHECK_HOSTNAME (the data nodes' TLS settings)",
    ("tls", "sentinel"): "check SENTINEL_SSL, SENTINEL_SSL_CA_CERTS, "
    "SENTINEL_SSL_CERTFILE/SENTINEL_SSL_KEYFILE and SENTINEL_SSL_CHECK_HOSTNAME",
}
_VERBS = {
    "credentials": "rejected the credentials",
    "permission": "denied a command to the configured user (ACL)",
    "tls": "failed TLS verification",
}


def credential_failure(exc: BaseException | None) -> str | None:
    """``"credentials"``, ``"permission"`` or ``"tls"`` if ``exc`` (or what caused it) says our
    credentials or certificates were refused; None for anything a retry might fix."""
    seen: set[int] = set()
    current = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, (redis.AuthenticationError, AuthenticationWrongNumberOfArgsError)):
            return "credentials"
        if isinstance(current, NoPermissionError):
            return "permission"
        if isinstance(current, redis.ResponseError) and str(current).startswith(_CREDENTIAL_CODES):
            return "permission" if str(current).startswith("NOPERM") else "credentials"
        if isinstance(current, ssl.SSLError) and not isinstance(current, _TRANSIENT_SSL_ERRORS):
            return "tls"
        current = current.__cause__ or current.__context__
    return None


def refusal(exc: BaseException | None, side: str) -> tuple[str, str] | None:
    """``(what the server did, what to check)`` if ``exc`` says a ``side`` (``"sentinel"`` or
    ``"data node"``) refused our credentials, permissions or certificates; None otherwise.
    For reports that name the refusal themselves (the status command, the deploy check)."""
    kind = credential_failure(exc)
    return None if kind is None else (_VERBS[kind], _HINTS[kind, side])


def data_node_refusal(
    exc: BaseException, subject: str, address: Address | None, secrets: Sequence[str] = ()
) -> DataNodeAuthenticationError | None:
    """The error to raise when the data node at ``address`` refused our credentials or TLS
    (``subject`` names the shard), or None when ``exc`` is no such refusal."""
    kind = credential_failure(exc)
    if kind is None:
        return None
    error = redact(f"{type(exc).__name__}: {exc}", secrets)
    return DataNodeAuthenticationError(
        f"{subject}: the data node {address} {_VERBS[kind]} ({error}); {_HINTS[kind, 'data node']}"
    )


def secret_values(kwargs: Mapping[str, Any]) -> tuple[str, ...]:
    """The secrets in a set of connection options, for :func:`redact` (short ones are left out:
    replacing every "ab" in a message would garble it, and such a secret protects nothing)."""
    values = (kwargs.get("password"), kwargs.get("ssl_password"))
    return tuple(str(v) for v in values if v is not None and len(str(v)) >= 4)


def redact(text: str, secrets: Sequence[str]) -> str:
    """``text`` with every secret replaced by ``***`` (servers do not echo passwords, but a
    message that is logged and shown must not depend on that)."""
    for secret in secrets:
        text = text.replace(secret, "***")
    return text


def direct_client(address: Address, kwargs: Mapping[str, Any], **extra: Any) -> redis.Redis:
    """A client on an explicit pool: redis-py's client-level default retries (up to several
    seconds of backoff) would turn a dead node into a stall instead of a fast error."""
    connection_class, options = connection_class_and_kwargs({**kwargs, **extra})
    pool = redis.ConnectionPool(
        host=address.host, port=address.port, connection_class=connection_class, **options
    )
    return redis.Redis(connection_pool=pool)


class SentinelSet:
    """The configured sentinels, their clients, and the order to ask them in."""

    def __init__(self, addresses: Sequence[Address], sentinel_kwargs: Mapping[str, Any]) -> None:
        self._lock = threading.Lock()
        self._addresses: list[Address] = list(addresses)
        self._configured = frozenset(addresses)
        self._kwargs = dict(sentinel_kwargs)
        self._clients: dict[Address, redis.Redis] = {}
        self._fanouts: list[Fanout[Address, SentinelReply]] = []  # asking, or done asking
        self._rejected: set[Address] = set()
        self.secrets = secret_values(self._kwargs)

    def __repr__(self) -> str:
        return f"<SentinelSet {[str(a) for a in self.addresses]}>"

    @property
    def addresses(self) -> list[Address]:
        with self._lock:
            return list(self._addresses)

    @property
    def kwargs(self) -> dict[str, Any]:
        return dict(self._kwargs)

    def client(self, address: Address) -> redis.Redis:
        """A small pooled client per sentinel, reused across rounds."""
        with self._lock:
            client = self._clients.get(address)
            if client is None:
                client = direct_client(address, self._kwargs, max_connections=4)
                self._clients[address] = client
            return client

    def config_epoch(self, address: Address, name: str) -> int:
        """The config epoch sentinel ``address`` holds for master ``name``; 0 if it cannot say."""
        try:
            return config_epoch(self.client(address).execute_command("SENTINEL", "MASTER", name))
        except (redis.RedisError, OSError):
            return 0

    def note_rejections(self, replies: Sequence[SentinelReply]) -> None:
        """Warn once per sentinel that refuses our credentials (until it accepts them again)."""
        for reply in replies:
            kind = credential_failure(reply.error)
            with self._lock:
                if reply.error is None:
                    self._rejected.discard(reply.sentinel)
                if kind is None or reply.sentinel in self._rejected:
                    continue  # answered, or not waited for, or already reported
                self._rejected.add(reply.sentinel)
            logger.warning(
                "sentinel %s %s: %s (%s)",
                reply.sentinel,
                _VERBS[kind],
                redact(f"{type(reply.error).__name__}: {reply.error}", self.secrets),
                _HINTS[kind, "sentinel"],
            )

    def promote(self, address: Address) -> None:
        with self._lock:
            if address in self._addresses and self._addresses[0] != address:
                self._addresses.remove(address)
                self._addresses.insert(0, address)

    def learn(self, addresses: Sequence[Address]) -> None:
        with self._lock:
            for address in addresses:
                if len(self._addresses) >= max(MAX_SENTINELS, len(self._configured)):
                    break
                if address not in self._addresses:
                    logger.info("learned sentinel %s", address)
                    self._addresses.append(address)

    def ask_all(
        self, masters: Sequence[str], *, replicas: bool = False, wait: float | None = None
    ) -> list[SentinelReply]:
        """Ask every sentinel at once; return replies in order of arrival.

        Returns early once a majority of sentinels agree on every master; otherwise waits for
        the rest up to ``wait`` (default: the sentinel socket timeouts), never longer.
        """
        addresses = self.addresses
        if wait is None:
            wait = float(self._kwargs.get("socket_timeout") or 0.5) + float(
                self._kwargs.get("socket_connect_timeout") or 0.5
            )
        fanout: Fanout[Address, SentinelReply] = Fanout(
            {
                address: functools.partial(self._ask_one, address, tuple(masters), replicas)
                for address in addresses
            },
            name="sentinel_cache-ask",
        )
        with self._lock:
            self._fanouts = [f for f in self._fanouts if f.running] + [fanout]
        majority = len(addresses) // 2 + 1
        arrived = fanout.collect(
            time.monotonic() + wait,
            enough=lambda so_far: _agreed([_as_reply(*item) for item in so_far], masters, majority),
        )
        replies = [_as_reply(*item) for item in arrived]
        agreed = _agreed(replies, masters, majority)
        answered = {r.sentinel for r in replies}
        why = "not awaited: a majority agreed" if agreed else f"no answer within {wait:.2f}s"
        for address in addresses:
            if address not in answered:
                replies.append(SentinelReply(address, error=TimeoutError(why)))
        return replies

    def _ask_one(
        self,
        address: Address,
        masters: tuple[str, ...],
        replicas: bool,
    ) -> SentinelReply:
        reply = SentinelReply(address)
        started = time.monotonic()
        try:
            pipe = self.client(address).pipeline(transaction=False)
            for name in masters:
                pipe.execute_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", name)
                pipe.execute_command("SENTINEL", "SENTINELS", name)
                pipe.execute_command("SENTINEL", "MASTER", name)
                if replicas:
                    pipe.execute_command("SENTINEL", "REPLICAS", name)
            results = pipe.execute(raise_on_error=False)
            step = 4 if replicas else 3
            for i, name in enumerate(masters):
                master, peers = results[i * step], results[i * step + 1]
                reply.epochs[name] = config_epoch(results[i * step + 2])
                if isinstance(master, BaseException):
                    raise master
                if master and not (isinstance(master, (list, tuple)) and len(master) == 2):
                    raise ValueError(
                        f"malformed reply to SENTINEL GET-MASTER-ADDR-BY-NAME {name}: "
                        f"{master!r:.80}"
                    )
                reply.masters[name] = reply_address(*master) if master else None
                if isinstance(peers, list):
                    for flat in peers:
                        try:
                            info = reply_fields(flat)
                            if not (instance_healthy(info) and "ip" in info):
                                continue
                            peer = reply_address(info["ip"], info["port"])
                        except (TypeError, ValueError, KeyError, IndexError):
                            continue  # one garbled peer entry: skip it, keep the rest
                        if peer not in reply.peers:
                            reply.peers.append(peer)
                if replicas:
                    found = results[i * step + 3]
                    reply.replicas[name] = [
                        reply_address(info["ip"], info["port"])
                        for info in map(reply_fields, found if isinstance(found, list) else [])
                        if instance_healthy(info) and info.get("master-link-status", "ok") == "ok"
                    ]
        except BaseException as exc:  # reported to the caller, who names every sentinel's failure
            reply.error = exc
        reply.elapsed = time.monotonic() - started
        return reply

    def disconnect(self) -> None:
        """Close the idle sockets to the sentinels (they reconnect on next use)."""
        with self._lock:
            clients = list(self._clients.values())
        for client in clients:
            client.connection_pool.disconnect(inuse_connections=False)

    def active_threads(self) -> int:
        """Discovery threads still asking a sentinel (none once closed)."""
        with self._lock:
            return sum(fanout.running for fanout in self._fanouts)

    def close(self) -> None:
        with self._lock:
            clients, self._clients = list(self._clients.values()), {}
            fanouts, self._fanouts = self._fanouts, []
        for fanout in fanouts:
            fanout.join(timeout=5)
        for client in clients:
            client.close()
            client.connection_pool.disconnect()


def _as_reply(address: Address, outcome: SentinelReply | BaseException) -> SentinelReply:
    """A sentinel's reply, or its asking's exception as one (so no failure goes unnamed)."""
    return outcome if isinstance(outcome, SentinelReply) else SentinelReply(address, error=outcome)


def _agreed(replies: Sequence[SentinelReply], masters: Sequence[str], majority: int) -> bool:
    for name in masters:
        counts: dict[Address, int] = {}
        for reply in replies:
            address = reply.masters.get(name)
            if address is not None:
                counts[address] = counts.get(address, 0) + 1
        if not counts or max(counts.values()) < majority:
            return False
    return True


def config_epoch(reply: Any) -> int:
    """The ``config-epoch`` in a ``SENTINEL MASTER`` reply; 0 when absent, refused (an ACL
    without ``+sentinel|master``) or garbled: the answer then carries no epoch evidence."""
    try:
        return max(0, int(reply_fields(reply).get("config-epoch", 0)))
    except (TypeError, ValueError, IndexError, AttributeError):
        return 0


def summarize_failures(
    replies: Sequence[SentinelReply], name: str, secrets: Sequence[str] = ()
) -> str:
    parts = []
    for reply in replies:
        if reply.error is not None:
            kind = credential_failure(reply.error)
            verb = "" if kind is None else f"{_VERBS[kind]}: "
            error = redact(f"{type(reply.error).__name__}: {reply.error}", secrets)
            parts.append(f"{reply.sentinel}: {verb}{error}")
        elif reply.masters.get(name) is None:
            parts.append(f"{reply.sentinel}: does not monitor {name!r}")
        else:
            parts.append(f"{reply.sentinel}: named {reply.masters[name]}")
    return redact("; ".join(parts), secrets)


def check_role(address: Address, connection_kwargs: Mapping[str, Any]) -> str:
    """``ROLE`` of the node at ``address`` ("master", "slave", ...), with the data nodes' options."""
    client = direct_client(address, connection_kwargs)
    try:
        role = client.execute_command("ROLE")
        if not isinstance(role, (list, tuple)) or not role or not isinstance(role[0], (bytes, str)):
            raise redis.ResponseError(f"malformed ROLE reply: {role!r:.80}")
        return reply_text(role[0])
    finally:
        client.close()
        client.connection_pool.disconnect()


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
        while True:
            asked_at = time.monotonic()
            replies = self.sentinels.ask_all(pending, replicas=self._replicas)
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
                return results
            time.sleep(delay * random.uniform(0.8, 1.2))
            delay = min(delay * 2, 0.5)

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
                    f"master {name!r}: the sentinels {_VERBS[kind]} "
                    f"({len(kinds)} of {len(replies)}; {summary}); {_HINTS[kind, 'sentinel']}"
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
