"""Finding each shard's master (and replicas) through the sentinels.

Follows the Redis "Sentinel client guidelines": short timeouts, every sentinel asked, a null reply
means "ask the next", ``ROLE`` verifies the answer, the sentinel that answered first goes to the
front, sentinels learned from ``SENTINEL SENTINELS`` are added. All sentinels are asked at once,
with one pipelined round trip each, so a black-holed sentinel costs one timeout per round, not
one per shard.
"""

from __future__ import annotations

import logging
import queue
import random
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import redis

from sentinel_cache.config import Address, connection_class_and_kwargs
from sentinel_cache.exceptions import MasterNotFoundError, NoSentinelReachableError

logger = logging.getLogger("sentinel_cache")


@dataclass
class SentinelReply:
    """What one sentinel said in one round: per master, its address, replicas and peers."""

    sentinel: Address
    masters: dict[str, Address | None] = field(default_factory=dict)
    replicas: dict[str, list[Address]] = field(default_factory=dict)
    peers: list[Address] = field(default_factory=list)
    error: BaseException | None = None
    elapsed: float = 0.0


@dataclass(frozen=True)
class Resolution:
    """The verified master of one shard, and how many sentinels named it."""

    name: str
    address: Address
    replicas: tuple[Address, ...]
    agreeing: int
    answered: int


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _pairs(reply: Any) -> dict[str, str]:
    """A sentinel's per-instance reply: a flat list, or a dict once redis-py has parsed it."""
    if isinstance(reply, Mapping):
        return {_text(k): _text(v) for k, v in reply.items()}
    return {_text(reply[i]): _text(reply[i + 1]) for i in range(0, len(reply) - 1, 2)}


def _healthy(info: Mapping[str, str]) -> bool:
    flags = set(info.get("flags", "").split(","))
    return not flags & {"s_down", "o_down", "disconnected"}


def _address(host: Any, port: Any) -> Address:
    return Address(_text(host), int(port))


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
        self._threads: set[threading.Thread] = set()
        self._closed = False

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

    def promote(self, address: Address) -> None:
        with self._lock:
            if address in self._addresses and self._addresses[0] != address:
                self._addresses.remove(address)
                self._addresses.insert(0, address)

    def learn(self, addresses: Sequence[Address]) -> None:
        with self._lock:
            for address in addresses:
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
        inbox: queue.Queue[SentinelReply] = queue.Queue()
        for address in addresses:
            thread = threading.Thread(
                target=self._ask_one,
                args=(address, tuple(masters), replicas, inbox),
                name=f"sentinel_cache-ask-{address}",
                daemon=True,
            )
            with self._lock:
                self._threads.add(thread)
            thread.start()
        replies: list[SentinelReply] = []
        deadline = time.monotonic() + wait
        majority = len(addresses) // 2 + 1
        while len(replies) < len(addresses):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            try:
                replies.append(inbox.get(timeout=remaining))
            except queue.Empty:
                break
            if _agreed(replies, masters, majority):
                break
        answered = {r.sentinel for r in replies}
        for address in addresses:
            if address not in answered:
                replies.append(
                    SentinelReply(address, error=TimeoutError(f"no answer within {wait:.2f}s"))
                )
        return replies

    def _ask_one(
        self,
        address: Address,
        masters: tuple[str, ...],
        replicas: bool,
        inbox: queue.Queue[SentinelReply],
    ) -> None:
        reply = SentinelReply(address)
        started = time.monotonic()
        try:
            pipe = self.client(address).pipeline(transaction=False)
            for name in masters:
                pipe.execute_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", name)
                pipe.execute_command("SENTINEL", "SENTINELS", name)
                if replicas:
                    pipe.execute_command("SENTINEL", "REPLICAS", name)
            results = pipe.execute(raise_on_error=False)
            step = 3 if replicas else 2
            for i, name in enumerate(masters):
                master, peers = results[i * step], results[i * step + 1]
                if isinstance(master, BaseException):
                    raise master
                reply.masters[name] = _address(*master) if master else None
                if isinstance(peers, list):
                    for flat in peers:
                        info = _pairs(flat)
                        if _healthy(info) and "ip" in info:
                            peer = _address(info["ip"], info["port"])
                            if peer not in reply.peers:
                                reply.peers.append(peer)
                if replicas:
                    found = results[i * step + 2]
                    reply.replicas[name] = [
                        _address(info["ip"], info["port"])
                        for info in map(_pairs, found if isinstance(found, list) else [])
                        if _healthy(info) and info.get("master-link-status", "ok") == "ok"
                    ]
        except BaseException as exc:  # reported to the caller, who names every sentinel's failure
            reply.error = exc
        reply.elapsed = time.monotonic() - started
        inbox.put(reply)
        with self._lock:
            self._threads.discard(threading.current_thread())

    def close(self) -> None:
        with self._lock:
            self._closed = True
            clients, self._clients = list(self._clients.values()), {}
            threads = list(self._threads)
        for thread in threads:
            thread.join(timeout=5)
        for client in clients:
            client.close()
            client.connection_pool.disconnect()


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


def summarize_failures(replies: Sequence[SentinelReply], name: str) -> str:
    parts = []
    for reply in replies:
        if reply.error is not None:
            parts.append(f"{reply.sentinel}: {type(reply.error).__name__}: {reply.error}")
        elif reply.masters.get(name) is None:
            parts.append(f"{reply.sentinel}: does not monitor {name!r}")
        else:
            parts.append(f"{reply.sentinel}: named {reply.masters[name]}")
    return "; ".join(parts)


def check_role(address: Address, connection_kwargs: Mapping[str, Any]) -> str:
    """``ROLE`` of the node at ``address`` ("master", "slave", ...), with the data nodes' options."""
    client = direct_client(address, connection_kwargs)
    try:
        role = client.execute_command("ROLE")
        return _text(role[0])
    finally:
        client.close()
        client.connection_pool.disconnect()


class Discovery:
    """Resolves master names to verified master addresses, retrying for a bounded time."""

    def __init__(
        self,
        sentinels: SentinelSet,
        connection_kwargs: Mapping[str, Any],
        *,
        timeout: float,
        replicas: bool = False,
    ) -> None:
        self.sentinels = sentinels
        self._connection_kwargs = dict(connection_kwargs)
        self._timeout = timeout
        self._replicas = replicas

    def __repr__(self) -> str:
        return f"<Discovery sentinels={self.sentinels!r} timeout={self._timeout}s>"

    def resolve(
        self, masters: Sequence[str], *, timeout: float | None = None
    ) -> dict[str, Resolution | BaseException]:
        """Resolve every name; a name that could not be resolved in time maps to its error."""
        deadline = time.monotonic() + (self._timeout if timeout is None else timeout)
        pending = list(masters)
        results: dict[str, Resolution | BaseException] = {}
        delay = 0.05
        while True:
            replies = self.sentinels.ask_all(pending, replicas=self._replicas)
            self._remember(replies)
            for name in list(pending):
                outcome = self._pick(name, replies)
                results[name] = outcome
                if isinstance(outcome, Resolution):
                    pending.remove(name)
            if not pending or time.monotonic() + delay >= deadline:
                return results
            time.sleep(delay * random.uniform(0.8, 1.2))
            delay = min(delay * 2, 0.5)

    def _remember(self, replies: Sequence[SentinelReply]) -> None:
        first = next((r for r in replies if r.error is None), None)
        if first is not None:
            self.sentinels.promote(first.sentinel)
        for reply in replies:
            if reply.error is None:
                self.sentinels.learn(reply.peers)

    def _pick(self, name: str, replies: Sequence[SentinelReply]) -> Resolution | BaseException:
        answered = [r for r in replies if r.error is None]
        if not answered:
            return NoSentinelReachableError(
                f"master {name!r}: no sentinel reachable ({summarize_failures(replies, name)})"
            )
        votes: dict[Address, int] = {}
        for reply in answered:
            address = reply.masters.get(name)
            if address is not None:
                votes[address] = votes.get(address, 0) + 1
        if not votes:
            return MasterNotFoundError(
                f"master {name!r}: no sentinel monitors this name "
                f"({summarize_failures(replies, name)})"
            )
        # Most votes first; among equals, the earliest answer (replies arrive in order).
        order = {address: i for i, address in reversed(list(_arrivals(answered, name)))}
        candidates = sorted(votes, key=lambda a: (-votes[a], order[a]))
        failures = []
        for address in candidates:
            try:
                role = check_role(address, self._connection_kwargs)
            except (redis.RedisError, OSError) as exc:
                failures.append(f"{address}: {type(exc).__name__}: {exc}")
                continue
            if role == "master":
                replicas = next(
                    (tuple(r.replicas.get(name, ())) for r in answered if r.replicas.get(name)),
                    (),
                )
                return Resolution(name, address, replicas, votes[address], len(answered))
            failures.append(f"{address}: ROLE is {role!r}, not master")
        return MasterNotFoundError(
            f"master {name!r}: sentinels named {', '.join(map(str, candidates))} but none is a "
            f"reachable master ({'; '.join(failures)})"
        )


def _arrivals(replies: Sequence[SentinelReply], name: str) -> list[tuple[int, Address]]:
    return [
        (i, address)
        for i, reply in enumerate(replies)
        if (address := reply.masters.get(name)) is not None
    ]
