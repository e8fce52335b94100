"""One exception root, with categories that also subclass the natural builtin or redis-py class.

Callers that already catch ``ValueError`` or ``redis.ConnectionError`` keep working; callers that
want everything from this library catch :class:`SentinelCacheError`.
"""

from __future__ import annotations

import pickle
from typing import Any

from redis.exceptions import AuthenticationError as RedisAuthenticationError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError
from redis.exceptions import ResponseError as RedisResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError


class SentinelCacheError(Exception):
    """Root of every error raised by sentinel_cache."""


class ConfigurationError(SentinelCacheError, ValueError):
    """A configuration value is missing or invalid; the message names the field and the value.

    The parts of the message are also attributes, for code that reports or renames them
    (the Flask adapter names its own settings this way):

    * ``option``: the setting the message starts with, as the user wrote it (``SOCKET_TIMEOUT``,
      ``LOCATION``, ``OPTIONS``, ``CACHE_REDIS_URL``), or the core's dotted name where that is
      what is known (``connection_kwargs.socket_timeout`` from ``ShardedSentinelPool(...)``);
      ``None`` when the error names no setting.
    * ``value``: the offending value as the message shows it (secrets as ``"***"``, URLs with
      their secrets masked); ``None`` when the value is missing. For an error about the
      ``OPTIONS`` mapping itself (an unknown or repeated option) it is the option name.
    * ``reason``: the message without its ``option: `` prefix, so that
      ``str(exc) == f"{exc.option}: {exc.reason}"`` whenever ``option`` is set.
    """

    def __init__(
        self,
        message: str | None = None,
        *,
        option: str | None = None,
        value: object = None,
        reason: str | None = None,
    ) -> None:
        if message is None:
            message = (reason or "") if option is None else f"{option}: {reason}"
        elif reason is None:
            prefix = f"{option}: "
            has_prefix = option is not None and message.startswith(prefix)
            reason = message[len(prefix) :] if has_prefix else message
        super().__init__(message)
        self.option = option
        self.value = value
        self.reason: str = message if reason is None else reason

    def renamed(self, option: str) -> ConfigurationError:
        """The same error under another setting name (``max_connections`` ->
        ``MAX_CONNECTIONS``, ``OPTIONS`` -> ``CACHE_OPTIONS``); the reason and value stay."""
        return type(self)(option=option, value=self.value, reason=self.reason)

    def __reduce__(self) -> tuple[Any, ...]:
        # Keep the attributes across pickling (multiprocessing, test runners).
        return (type(self), self.args, self.__dict__)


class DiscoveryError(SentinelCacheError, RedisConnectionError):
    """A shard's master could not be found through the sentinels."""


class NoSentinelReachableError(DiscoveryError):
    """Every configured sentinel failed to answer (refused, timed out, or errored)."""


class MasterNotFoundError(DiscoveryError):
    """Sentinels answered, but none of them monitors this master name (or its node is no master)."""


class ConflictingMasterError(MasterNotFoundError):
    """The sentinels named for a shard only nodes that another shard is on (or was on): two
    shards on one node would mix their keys, so the answer is refused and asked again. The
    message names both shards, the node and the sentinels that named it."""


class AuthenticationFailedError(SentinelCacheError, RedisAuthenticationError):
    """A sentinel or data node rejected our credentials, or TLS verification failed.

    Raised for a wrong or missing password, an unknown or disabled ACL user, an ACL user without
    permission for the commands we need, and a TLS handshake that failed on a certificate (an
    unknown CA, a host name mismatch, a client certificate the server refused). Retrying cannot
    help, so discovery does not retry it. ``side`` is ``"sentinel"`` or ``"data node"``; the
    message names the nodes and which settings to check, and never contains a secret.
    """

    side: str = ""


class SentinelAuthenticationError(AuthenticationFailedError, NoSentinelReachableError):
    """The sentinels rejected the sentinel credentials (``sentinel_kwargs`` / ``SENTINEL_*``)."""

    side = "sentinel"


class DataNodeAuthenticationError(AuthenticationFailedError, MasterNotFoundError):
    """A shard's data node rejected the data-node credentials (``PASSWORD``/``USERNAME``/``SSL*``)."""

    side = "data node"


class ShardUnavailableError(SentinelCacheError, RedisConnectionError):
    """An operation on one shard failed because its master cannot be reached right now."""


class StaleReplyError(ShardUnavailableError):
    """A reply came from a node that stopped being the shard's master, or entered a failover,
    while the command was in flight, so it proves nothing: the write may be lost when that node
    is demoted. Idempotent operations are retried on the new master instead; others raise this
    (the outcome is unknown: the command may or may not have been applied). ``shard`` names the
    shard, ``address`` the node that answered."""

    def __init__(self, message: str, *, shard: str = "", address: object = None) -> None:
        super().__init__(message)
        self.shard = shard
        self.address = address


class ReplyProtocolError(ShardUnavailableError):
    """A shard's node answered with bytes that break the protocol: garbage, a reply of the
    wrong kind to the connection's handshake, or a declared size over the bound (an aggregate
    of more than ``MAX_REPLY_ELEMENTS`` elements, a bulk string over ``proto-max-bulk-len``),
    refused before anything was allocated for it. The connection was dropped; the message
    names the shard and the node's address. A :class:`ShardUnavailableError`: a node that
    answers so serves nothing."""


class PoolExhaustedError(SentinelCacheError, RedisConnectionError):
    """No free connection to a shard within the configured wait (Jedis ``maxWaitMillis``)."""


class FailoverInProgressError(SentinelCacheError, RedisTimeoutError):
    """Writes to a shard were held during a failover for longer than the configured bound."""


class SerializationError(SentinelCacheError, ValueError):
    """A value cannot be serialized with the configured serializer."""


class PicklingError(SerializationError, pickle.PicklingError):
    """A value cannot be pickled: our ``SerializationError`` and the ``pickle.PickleError`` that
    Django's and cachelib's contracts expect from pickling backends."""


class InvalidValueError(SentinelCacheError, ValueError):
    """Stored bytes cannot be decoded or verified; the cache reports a miss and logs a warning."""


class ProbeFailed(SentinelCacheError, RedisError):
    """The master answered, but not as a working master does (the write was not read back)."""


def _shown(value: object, limit: int = 200) -> str:
    """A value for a message: a 1 MB key must not make a 1 MB message."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} chars)"


class InvalidArgumentError(SentinelCacheError):
    """An argument of a cache call (a key, a timeout, a delta) was refused before anything was
    sent, so nothing changed. The message is ``"<argument>: <reason> (got <value>)"``;
    ``argument``, ``value`` and ``reason`` are attributes. Raised as one of the two below."""

    def __init__(self, argument: str, value: object, reason: str) -> None:
        super().__init__(f"{argument}: {reason} (got {_shown(value)})")
        self.argument = argument
        self.value = value
        self.reason = reason

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.argument, self.value, self.reason))


class ArgumentValueError(InvalidArgumentError, ValueError):
    """The argument has the right type but a value the cache refuses (a NaN or infinite
    timeout, one beyond the server's range, a key that is not valid Unicode)."""


class ValueTooLargeError(ArgumentValueError):
    """A value (or any argument) of a write is larger than its master accepts in one bulk
    string (its ``proto-max-bulk-len``, 512 MiB unless configured): refused before anything was
    sent. ``key``, ``size`` and ``limit`` (bytes) are attributes."""

    def __init__(self, key: object, size: int, limit: int) -> None:
        super().__init__(
            f"value of key {_shown(key)}",
            size,
            f"{size} bytes is over the master's proto-max-bulk-len of {limit} bytes",
        )
        self.key = key
        self.size = size
        self.limit = limit

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.key, self.size, self.limit))


class ArgumentTypeError(InvalidArgumentError, TypeError):
    """The argument is of a type the cache refuses (a string or bool timeout, a float delta,
    a key that is neither str nor bytes)."""


class IncrementError(SentinelCacheError, RedisResponseError, TypeError):
    """``incr``/``decr`` refused because of what the key holds: a value that is no integer, or
    another type than a string (``WRONGTYPE``); nothing changed. A ``redis.ResponseError`` (as Django's ``RedisCache``
    raises) and a ``TypeError`` (as Django's other backends do); ``key`` and ``reason`` are
    attributes."""

    def __init__(self, key: object, reason: str) -> None:
        super().__init__(f"incr/decr of key {_shown(key)}: {reason}")
        self.key = key
        self.reason = reason

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.key, self.reason))


__all__ = [
    "ArgumentTypeError",
    "ArgumentValueError",
    "AuthenticationFailedError",
    "ConfigurationError",
    "ConflictingMasterError",
    "DataNodeAuthenticationError",
    "DiscoveryError",
    "FailoverInProgressError",
    "IncrementError",
    "InvalidArgumentError",
    "InvalidValueError",
    "MasterNotFoundError",
    "NoSentinelReachableError",
    "PicklingError",
    "PoolExhaustedError",
    "ProbeFailed",
    "ReplyProtocolError",
    "SentinelAuthenticationError",
    "SentinelCacheError",
    "SerializationError",
    "ShardUnavailableError",
    "StaleReplyError",
    "ValueTooLargeError",
]
