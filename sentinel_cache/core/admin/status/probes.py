"""The status report's questions: every sentinel and every chosen master asked directly, on
fresh short-timeout connections, all at once."""

from __future__ import annotations

import functools
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import redis

from sentinel_cache.core.admin.states import STATUS_TIMEOUT, describe
from sentinel_cache.core.config import Address
from sentinel_cache.core.fanout import run_all
from sentinel_cache.core.topology.discovery import (
    direct_client,
    redact,
    refusal,
    reply_address,
    reply_fields,
    reply_text,
    secret_values,
)
from sentinel_cache.core.topology.replies import NOT_A_SENTINEL_HINT, not_a_sentinel

# What a sentinel did when asked; ``not_sentinel``: the address answers as a data node.
SENTINEL_OK, SENTINEL_UNREACHABLE, SENTINEL_AUTH_REFUSED = "ok", "unreachable", "auth_refused"
SENTINEL_NOT_SENTINEL = "not_sentinel"


def milliseconds(seconds: float) -> float:
    return round(seconds * 1000, 2)


def _client(address: Address, kwargs: Mapping[str, Any], timeout: float) -> redis.Redis:
    return direct_client(
        address,
        kwargs,
        socket_timeout=timeout,
        socket_connect_timeout=timeout,
        max_connections=1,
    )


def _close(client: redis.Redis) -> None:
    try:
        client.close()
    finally:
        client.connection_pool.disconnect()


def _timed_ping(client: redis.Redis) -> float:
    started = time.perf_counter()
    client.ping()
    return milliseconds(time.perf_counter() - started)


# -- sentinels ---------------------------------------------------------------------------------


@dataclass
class SentinelProbe:
    """What one sentinel answered: its state, latency and, per master, its view.

    ``state`` is ``"ok"`` (it answered), ``"unreachable"`` (refused, timed out, or the
    connection failed), ``"auth_refused"`` (it refused our credentials, our ACL user or our
    certificates: ``refused`` says which, ``hint`` what to check) or ``"not_sentinel"`` (it
    answered, as a Redis data node: no SENTINEL command; ``role`` is its ROLE, ``hint`` says
    what LOCATION must hold).
    """

    address: Address
    state: str = SENTINEL_UNREACHABLE
    latency_ms: float | None = None
    error: str | None = None
    refused: str | None = None
    hint: str | None = None
    masters: dict[str, Address | None | BaseException] = field(default_factory=dict)
    replicas: dict[str, list[dict[str, str]] | BaseException] = field(default_factory=dict)
    ckquorum: dict[str, tuple[bool, str]] = field(default_factory=dict)
    details: dict[str, dict[str, str]] = field(default_factory=dict)  # SENTINEL MASTER replies
    monitored: list[str] | None = None  # every master name it monitors (SENTINEL MASTERS)
    role: str | None = None  # a data node's ROLE ("master", "slave"), for ``not_sentinel``

    @property
    def reachable(self) -> bool:
        """It answered (an ``auth_refused`` sentinel is reachable on the network, but did not)."""
        return self.state == SENTINEL_OK

    def __repr__(self) -> str:
        state = f"{self.latency_ms}ms" if self.reachable else f"{self.state} ({self.error})"
        return f"<SentinelProbe {self.address} {state}>"


def _master_answer(reply: Any) -> Address | None | BaseException:
    if isinstance(reply, BaseException):
        return reply
    if not reply:
        return None
    try:
        return reply_address(*reply)
    except (TypeError, ValueError) as exc:  # a garbled reply costs this answer, not the probe
        return exc


def _monitored_names(reply: Any) -> list[str] | None:
    if not isinstance(reply, (list, tuple)):
        return None
    names = []
    for item in reply:
        try:
            names.append(reply_fields(item)["name"])
        except (KeyError, TypeError, IndexError, AttributeError):
            continue
    return names


def _probe_sentinel(
    address: Address, kwargs: Mapping[str, Any], masters: Sequence[str], timeout: float
) -> SentinelProbe:
    probe = SentinelProbe(address)
    client = _client(address, kwargs, timeout)
    try:
        results: list[Any] = []
        if masters:
            # One round trip for every question; it also opens the connection, so the timed
            # PING below measures the round trip alone, not the TCP/TLS handshake.
            pipe = client.pipeline(transaction=False)
            for name in masters:
                pipe.execute_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", name)
                pipe.execute_command("SENTINEL", "REPLICAS", name)
                pipe.execute_command("SENTINEL", "CKQUORUM", name)
                pipe.execute_command("SENTINEL", "MASTER", name)
            pipe.execute_command("SENTINEL", "MASTERS")
            results = pipe.execute(raise_on_error=False)
        else:  # PING, and SENTINEL MASTERS only to tell a data node (which lacks it) apart
            pipe = client.pipeline(transaction=False)
            pipe.ping()
            pipe.execute_command("SENTINEL", "MASTERS")
            results = pipe.execute(raise_on_error=False)
            if isinstance(results[0], BaseException):
                raise results[0]
        probe.latency_ms = _timed_ping(client)
        probe.state = SENTINEL_OK
        if results and not_a_sentinel(results[-1]):  # SENTINEL MASTERS: unknown command
            _not_a_sentinel(probe, client, results[-1])
            return probe
    except (redis.RedisError, OSError) as exc:
        if not_a_sentinel(exc):
            _not_a_sentinel(probe, client, exc)
            return probe
        probe.error = redact(describe(exc), secret_values(kwargs))
        refused = refusal(exc, "sentinel")
        if refused is not None:
            probe.state = SENTINEL_AUTH_REFUSED
            probe.refused, probe.hint = refused
        return probe
    finally:
        _close(client)
    for i, name in enumerate(masters):
        master, replicas, quorum, detail = results[4 * i : 4 * i + 4]
        probe.masters[name] = _master_answer(master)
        if isinstance(replicas, BaseException):
            probe.replicas[name] = replicas
        else:
            probe.replicas[name] = [reply_fields(item) for item in replicas or ()]
        if isinstance(quorum, BaseException):
            probe.ckquorum[name] = (False, str(quorum))
        else:
            probe.ckquorum[name] = (True, reply_text(quorum))
        if detail and not isinstance(detail, BaseException):
            probe.details[name] = reply_fields(detail)
    if masters:
        probe.monitored = _monitored_names(results[-1])
    return probe


def _not_a_sentinel(probe: SentinelProbe, client: redis.Redis, exc: BaseException) -> None:
    """Mark ``probe`` as a data node, with its ROLE when it says (one more short round trip)."""
    probe.state = SENTINEL_NOT_SENTINEL
    try:
        probe.role = reply_text(client.execute_command("ROLE")[0])
    except (redis.RedisError, OSError, IndexError, TypeError):
        probe.role = None
    role = f" (ROLE {probe.role})" if probe.role else ""
    probe.error = f"not a sentinel: {describe(exc)}"
    probe.hint = f"{probe.address}{role}: {NOT_A_SENTINEL_HINT}"


def probe_sentinels(
    addresses: Sequence[Address],
    sentinel_kwargs: Mapping[str, Any],
    *,
    timeout: float = STATUS_TIMEOUT,
    masters: Sequence[str] = (),
) -> list[SentinelProbe]:
    """Ask every sentinel at once (PING, plus each master's view if ``masters`` are given).

    Returns one probe per address, in the given order, within about two ``timeout`` periods.
    """
    tasks = {
        address: functools.partial(_probe_sentinel, address, sentinel_kwargs, masters, timeout)
        for address in addresses
    }
    outcomes = run_all(tasks, time.monotonic() + 2 * timeout + 0.1, "sentinels")
    probes = []
    for address in addresses:
        outcome = outcomes[address]
        if isinstance(outcome, BaseException):
            outcome = SentinelProbe(address, error=describe(outcome))
        probes.append(outcome)
    return probes


# -- data nodes --------------------------------------------------------------------------------

NODE_FIELDS = (
    "role",
    "role_error",
    "refused",
    "error",
    "latency_ms",
    "keys",
    "memory",
    "run_id",
    "uptime_seconds",
)


def probe_node(address: Address, kwargs: Mapping[str, Any], timeout: float) -> dict[str, Any]:
    """ROLE, PING latency, DBSIZE and used memory of one data node.

    ``role_error`` means the node could not say what it is (``refused``: it refused our
    credentials; ``(what it did, what to check)``); ``error`` is a later failure.
    """
    found: dict[str, Any] = dict.fromkeys(NODE_FIELDS)
    client = _client(address, kwargs, timeout)
    try:
        try:
            found["role"] = reply_text(client.execute_command("ROLE")[0])
        except (redis.RedisError, OSError) as exc:
            found["role_error"] = redact(describe(exc), secret_values(kwargs))
            found["refused"] = refusal(exc, "data node")
            return found
        found["latency_ms"] = _timed_ping(client)
        pipe = client.pipeline(transaction=False)
        pipe.dbsize()
        pipe.info("memory")
        pipe.info("server")
        keys, memory, server = pipe.execute(raise_on_error=False)
        if not isinstance(keys, BaseException):
            found["keys"] = int(keys)
        if isinstance(memory, Mapping):
            found["memory"] = memory.get("used_memory_human")
        if isinstance(server, Mapping):  # a young uptime with no failover: an empty restart?
            found["run_id"] = server.get("run_id")
            found["uptime_seconds"] = server.get("uptime_in_seconds")
    except (redis.RedisError, OSError) as exc:
        found["error"] = describe(exc)
    finally:
        _close(client)
    return found
