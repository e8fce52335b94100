"""What the sentinels and data nodes say, read: replies parsed into addresses and fields, and
refusals (a rejected password, a missing ACL permission, a failed TLS check) turned into an
explanation that names the side and never a secret.

Shared by the topology (:mod:`~sentinel_cache.core.topology.discovery`) and the operator tools,
which read the same replies; none of it keeps state.
"""

from __future__ import annotations

import ssl
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import redis
from redis.exceptions import AuthenticationWrongNumberOfArgsError, NoPermissionError

from sentinel_cache.core.config import Address, connection_class_and_kwargs
from sentinel_cache.exceptions import (
    DataNodeAuthenticationError,
)


@dataclass
class SentinelReply:
    """What one sentinel said in one round: per master, its address, replicas and peers."""

    sentinel: Address
    masters: dict[str, Address | None] = field(default_factory=dict)
    epochs: dict[str, int] = field(default_factory=dict)
    replicas: dict[str, list[Address]] = field(default_factory=dict)
    peers: list[Address] = field(default_factory=list)
    error: BaseException | None = None
    # Per master, the error its own question got: a data node refuses every SENTINEL command,
    # and each shard's message should quote that shard's command, not the first one's.
    failures: dict[str, BaseException] = field(default_factory=dict)
    elapsed: float = 0.0


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


# A connection dropped in the middle of a handshake is not a verdict on our certificates.
TRANSIENT_SSL_ERRORS = (
    ssl.SSLEOFError,
    ssl.SSLZeroReturnError,
    ssl.SSLSyscallError,
    ssl.SSLWantReadError,
    ssl.SSLWantWriteError,
)
CREDENTIAL_CODES = ("NOAUTH", "WRONGPASS", "NOPERM")

#: What to check, per kind of rejection and side.
HINTS = {
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
VERBS = {
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
        if isinstance(current, redis.ResponseError) and str(current).startswith(CREDENTIAL_CODES):
            return "permission" if str(current).startswith("NOPERM") else "credentials"
        if isinstance(current, ssl.SSLError) and not isinstance(current, TRANSIENT_SSL_ERRORS):
            return "tls"
        current = current.__cause__ or current.__context__
    return None


def acl_refusal(exc: BaseException | None) -> bool:
    """``exc`` is an ACL refusal (``NOPERM``): the user lacks a command, not a wrong master
    name (``ERR No such master``) or a server that is no sentinel (``unknown command``)."""
    return credential_failure(exc) == "permission"


#: What a Redis/Valkey data node answers to SENTINEL commands (it has no such command).
NOT_A_SENTINEL_REPLY = "unknown command 'sentinel'"


def not_a_sentinel(exc: BaseException | None) -> bool:
    """``exc`` says the server asked is no sentinel: a data node's "unknown command 'SENTINEL'"."""
    return isinstance(exc, redis.ResponseError) and NOT_A_SENTINEL_REPLY in str(exc).lower()


#: What to do about an address of LOCATION that answers as a data node.
NOT_A_SENTINEL_HINT = (
    "it answers as a Redis data node, not as a sentinel: LOCATION (Flask: "
    "CACHE_REDIS_SENTINELS) must list the sentinels' host:port (their port is 26379 by "
    "default), not the masters' or replicas'"
)


def refusal(exc: BaseException | None, side: str) -> tuple[str, str] | None:
    """``(what the server did, what to check)`` if ``exc`` says a ``side`` (``"sentinel"`` or
    ``"data node"``) refused our credentials, permissions or certificates; None otherwise.
    For reports that name the refusal themselves (the status command, the deploy check)."""
    kind = credential_failure(exc)
    return None if kind is None else (VERBS[kind], HINTS[kind, side])


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
        f"{subject}: the data node {address} {VERBS[kind]} ({error}); {HINTS[kind, 'data node']}"
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
    data_nodes = False
    for reply in replies:
        if reply.error is not None:
            failure = reply.failures.get(name, reply.error)  # this master's own command
            kind = credential_failure(failure)
            verb = "" if kind is None else f"{VERBS[kind]}: "
            error = redact(f"{type(failure).__name__}: {failure}", secrets)
            if not_a_sentinel(failure):
                verb, data_nodes = "not a sentinel: ", True
            parts.append(f"{reply.sentinel}: {verb}{error}")
        elif reply.masters.get(name) is None:
            parts.append(f"{reply.sentinel}: does not monitor {name!r}")
        else:
            parts.append(f"{reply.sentinel}: named {reply.masters[name]}")
    if data_nodes:
        parts.append(NOT_A_SENTINEL_HINT.replace("it answers", "an address that answers", 1))
    return redact("; ".join(parts), secrets)
