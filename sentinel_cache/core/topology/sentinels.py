"""The configured sentinels (and those learned from ``SENTINEL SENTINELS``), their clients, and
one round of asking them all at once: each sentinel gets one pipelined round trip, answered or
timed out, and the one that answered first goes to the front.

:class:`~sentinel_cache.core.topology.discovery.Discovery` decides what the answers mean.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

import redis

from sentinel_cache.core.config import Address
from sentinel_cache.core.fanout import Fanout
from sentinel_cache.core.topology.replies import (
    HINTS,
    VERBS,
    SentinelReply,
    acl_refusal,
    config_epoch,
    credential_failure,
    direct_client,
    instance_healthy,
    redact,
    reply_address,
    reply_fields,
    secret_values,
)

logger = logging.getLogger("sentinel_cache")


#: A sentinel asked nothing for this many seconds has its discovery sockets closed
#: (:meth:`SentinelSet.close_idle`): questions come in bursts (a failover, a resync), and a
#: socket kept between bursts costs every sentinel one connection per process.
IDLE_SOCKET_SECONDS = 10.0

# Learned sentinels beyond this are ignored: a broken sentinel may list thousands of "peers",
# and every round asks every known sentinel (a thread each) and runs a listener for each.
MAX_SENTINELS = 16


class SentinelSet:
    """The configured sentinels, their clients, and the order to ask them in."""

    def __init__(self, addresses: Sequence[Address], sentinel_kwargs: Mapping[str, Any]) -> None:
        self._lock = threading.Lock()
        self._addresses: list[Address] = list(addresses)
        self._configured = frozenset(addresses)
        self._kwargs = dict(sentinel_kwargs)
        self._clients: dict[Address, redis.Redis] = {}
        self._used: dict[Address, float] = {}  # last asked, for the sentinels with open sockets
        self._fanouts: list[Fanout[Address, SentinelReply]] = []  # asking, or done asking
        self._rejected: set[Address] = set()
        self._no_epoch: set[Address] = set()  # refused SENTINEL MASTER, already reported
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

    @property
    def round_wait(self) -> float:
        """How long a round waits for the sentinels at most: their socket timeouts."""
        return float(self._kwargs.get("socket_timeout") or 0.5) + float(
            self._kwargs.get("socket_connect_timeout") or 0.5
        )

    def client(self, address: Address) -> redis.Redis:
        """A small pooled client per sentinel, reused across rounds."""
        with self._lock:
            client = self._clients.get(address)
            if client is None:
                client = direct_client(address, self._kwargs, max_connections=4)
                self._clients[address] = client
            self._used[address] = time.monotonic()
            return client

    def close_idle(self, idle: float | None = None) -> None:
        """Close the idle sockets to the sentinels asked nothing for ``idle`` seconds (default
        :data:`IDLE_SOCKET_SECONDS`; the housekeeper's clock); the next question reconnects."""
        idle = IDLE_SOCKET_SECONDS if idle is None else idle
        now = time.monotonic()
        with self._lock:
            quiet = [a for a, used in self._used.items() if now - used >= idle]
            clients = [self._clients[a] for a in quiet if a in self._clients]
            for address in quiet:
                del self._used[address]
        for client in clients:
            client.connection_pool.disconnect(inuse_connections=False)

    def config_epoch(self, address: Address, name: str) -> int:
        """The config epoch sentinel ``address`` holds for master ``name``; 0 if it cannot say."""
        try:
            reply = self.client(address).execute_command("SENTINEL", "MASTER", name)
        except redis.ResponseError as exc:
            self.note_epoch_refused(address, exc)
            return 0
        except (redis.RedisError, OSError):
            return 0
        return config_epoch(reply)

    def note_epoch_refused(self, address: Address, error: BaseException) -> None:
        """Warn once per sentinel that refuses ``SENTINEL MASTER`` (an ACL without
        ``+sentinel|master``): its answers then carry no config epoch, so a switch is ordered by
        when it was heard, not by the sentinels' epoch (a late answer from a sentinel that missed
        the failover can then win until the next one). Only for an ACL refusal (``NOPERM``): an
        unmonitored name or a data node also refuses the command, and the ACL advice would
        send the operator the wrong way (the name's or the address's error says why)."""
        if not acl_refusal(error):
            return
        with self._lock:
            if address in self._no_epoch:
                return
            self._no_epoch.add(address)
        logger.warning(
            "sentinel %s refuses SENTINEL MASTER (%s): switches are ordered by arrival, not by "
            "config epoch; allow +sentinel|master for this user",
            address,
            redact(f"{type(error).__name__}: {error}", self.secrets),
        )

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
                VERBS[kind],
                redact(f"{type(reply.error).__name__}: {reply.error}", self.secrets),
                HINTS[kind, "sentinel"],
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
            wait = self.round_wait
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
                if isinstance(results[i * step], BaseException):
                    reply.failures[name] = results[i * step]
            for i, name in enumerate(masters):
                master, peers = results[i * step], results[i * step + 1]
                detail = results[i * step + 2]
                if isinstance(detail, redis.ResponseError):
                    self.note_epoch_refused(address, detail)
                reply.epochs[name] = config_epoch(detail)
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
