"""One shard's probe: a key written and read back on its master, on the probe's own
connections (kept per core), the safety net's first step taken on a failure."""

from __future__ import annotations

import os
import threading
import time
import uuid
import weakref
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import redis

from sentinel_cache.core.admin.states import describe
from sentinel_cache.core.config import Address, connection_class_and_kwargs
from sentinel_cache.core.topology.discovery import redact, reply_text, secret_values
from sentinel_cache.exceptions import AuthenticationFailedError, ProbeFailed

if TYPE_CHECKING:
    from sentinel_cache.core.topology.shard import Shard
    from sentinel_cache.core.topology.sharded_pool import ShardedSentinelPool


#: The probe keys' expiry: a probe leaves nothing behind for long.
PROBE_TTL_MS = 10_000
PROBE_PREFIX = "sentinel_cache:health:"
_TOKEN_PREFIX = "sentinel_cache-probe:"
_KEY_SEARCH_LIMIT = 1_000_000
_MAX_PROBE_CONNECTIONS = 8  # per master and budget; probes of a hung node end by their timeouts


@dataclass(frozen=True)
class ShardHealth:
    """One shard's probe: ``ok`` if its master took the write and returned it."""

    index: int
    name: str
    ok: bool
    #: The master probed (the last one tried), None if no master is known.
    address: str | None
    latency_ms: float | None
    #: Why the probe failed, naming the shard and its master; None when ok.
    error: str | None
    key: str
    #: Replicas the master reports online (``ROLE``); None if it could not be asked.
    replicas_online: int | None = None
    fenced: bool = False
    #: What reduces this shard's redundancy (also in the report's ``warnings``).
    warnings: tuple[str, ...] = ()

    @property
    def label(self) -> str:
        return f"{self.index} ({self.name})"


# -- probe keys and connections, kept per core -------------------------------------------------


def probe_key(core: ShardedSentinelPool, index: int) -> str:
    """The first ``sentinel_cache:health:<name>:<n>`` the ring places on shard ``index``."""
    shard = core.shards[index]
    for n in range(_KEY_SEARCH_LIMIT):
        key = f"{PROBE_PREFIX}{shard.name}:{n}"
        if core.shard_index(key) == index:
            return key
    raise RuntimeError(f"no probe key for shard {shard.label} in {_KEY_SEARCH_LIMIT} tries")


class Prober:
    """A core's probe keys and the probes' own connections (per master and budget)."""

    def __init__(self, core: ShardedSentinelPool) -> None:
        self.pid = os.getpid()
        self.keys = tuple(probe_key(core, shard.index) for shard in core.shards)
        self.secrets = secret_values(core.config.connection_options())
        self._options = core.config.connection_options()
        self._lock = threading.Lock()
        self._clients: dict[tuple[Address, float], redis.Redis] = {}

    def client(self, address: Address, timeout: float) -> redis.Redis:
        with self._lock:
            client = self._clients.get((address, timeout))
            if client is None:
                connection_class, options = connection_class_and_kwargs(
                    {
                        **self._options,
                        "socket_timeout": timeout,
                        "socket_connect_timeout": timeout,
                    }
                )
                # An explicit pool: none of redis-py's client-level retries and backoff.
                pool = redis.ConnectionPool(
                    host=address.host,
                    port=address.port,
                    connection_class=connection_class,
                    max_connections=_MAX_PROBE_CONNECTIONS,
                    **options,
                )
                client = self._clients[address, timeout] = redis.Redis(connection_pool=pool)
            return client

    def keep_only(self, addresses: Iterable[Address | None]) -> None:
        """Close the connections to nodes that are no shard's master any more."""
        current = set(addresses)
        with self._lock:
            gone = [k for k in self._clients if k[0] not in current]
            dropped = [self._clients.pop(k) for k in gone]
        for client in dropped:
            client.connection_pool.disconnect()

    def close(self) -> None:
        self.keep_only(())


_probers: weakref.WeakKeyDictionary[ShardedSentinelPool, Prober] = weakref.WeakKeyDictionary()
_probers_lock = threading.Lock()


def _reinit_after_fork() -> None:
    global _probers_lock
    _probers_lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reinit_after_fork)


def prober_of(core: ShardedSentinelPool) -> Prober:
    with _probers_lock:
        prober = _probers.get(core)
        if prober is None or prober.pid != os.getpid():
            prober = _probers[core] = Prober(core)
            core.on_close(prober.close)
        return prober


# -- the probe ---------------------------------------------------------------------------------


def _online_replicas(role: Any) -> int | None:
    """How many replicas a master's ``ROLE`` reply lists (only online ones are listed)."""
    if isinstance(role, BaseException) or not isinstance(role, (list, tuple)) or len(role) < 3:
        return None
    if reply_text(role[0]) != "master" or not isinstance(role[2], (list, tuple)):
        return None
    return len(role[2])


def _round_trip(client: redis.Redis, key: str) -> tuple[float, int | None]:
    """SET the key with a new token, GET it back and ask ROLE, in one round trip; returns the
    latency (ms) and the online replicas. Raises if the master did not work as one."""
    token = f"{_TOKEN_PREFIX}{uuid.uuid4().hex}"
    pipe = client.pipeline(transaction=False)
    pipe.set(key, token, px=PROBE_TTL_MS)
    pipe.get(key)
    pipe.execute_command("ROLE")
    started = time.perf_counter()
    stored, read, role = pipe.execute(raise_on_error=False)
    latency = round((time.perf_counter() - started) * 1000, 2)
    for reply in (stored, read):
        if isinstance(reply, BaseException):
            raise reply
    if not stored:
        raise ProbeFailed("the probe write was not acknowledged")
    text = None if read is None else reply_text(read)
    # Another process's probe may have written in between: its token proves reads work too.
    if text is None or not text.startswith(_TOKEN_PREFIX):
        raise ProbeFailed(f"the probe key read back {text!r:.60} instead of the token written")
    return latency, _online_replicas(role)


def probe_shard(
    core: ShardedSentinelPool, prober: Prober, shard: Shard, timeout: float, deadline: float
) -> ShardHealth:
    key = prober.keys[shard.index]

    def failed(address: Address | None, why: str) -> ShardHealth:
        if not why.startswith(f"shard {shard.label}"):  # the core's errors name it already
            where = "" if address is None else f"master {address}: "
            why = f"shard {shard.label}: {where}{why}"
        error = redact(why, prober.secrets)
        return ShardHealth(
            shard.index,
            shard.name,
            False,
            None if address is None else str(address),
            None,
            error,
            key,
            fenced=shard.fenced,
        )

    def succeeded(address: Address, latency: float, replicas: int | None) -> ShardHealth:
        return ShardHealth(
            shard.index, shard.name, True, str(address), latency, None, key, replicas, shard.fenced
        )

    try:
        core.ready(shard, False)  # starts the core; asks the sentinels for a shard with no master
    except Exception as exc:
        return failed(shard.address, str(exc) if str(exc).startswith("shard ") else describe(exc))
    address, generation = shard.current()
    if address is None:
        return failed(None, f"no master known ({shard.error})")
    try:
        return succeeded(address, *_round_trip(prober.client(address, timeout), key))
    except (redis.RedisError, OSError) as exc:
        error: BaseException = exc
    # The safety net's first step, as a cache call on this shard would take it.
    try:
        if core.should_reresolve(shard, error, generation):
            core.reresolve(shard, reason=f"health probe: {describe(error)}", suspect=address)
    except AuthenticationFailedError as refused:
        return failed(address, str(refused))
    except (redis.RedisError, OSError):
        pass  # the sentinels' trouble is reported by the warnings, the probe's by the error
    moved, now = shard.current()
    if now != generation and moved is not None and time.monotonic() < deadline:
        try:
            return succeeded(moved, *_round_trip(prober.client(moved, timeout), key))
        except (redis.RedisError, OSError) as exc:
            return failed(moved, describe(exc))
    return failed(address, describe(error))
