"""sentinel_cache: one cache over a sharded set of Sentinel-managed Redis masters."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from sentinel_cache.exceptions import (
    ArgumentTypeError,
    ArgumentValueError,
    AuthenticationFailedError,
    ConfigurationError,
    ConflictingMasterError,
    DataNodeAuthenticationError,
    DiscoveryError,
    FailoverInProgressError,
    IncrementError,
    InvalidArgumentError,
    InvalidValueError,
    MasterNotFoundError,
    NoSentinelReachableError,
    PicklingError,
    PoolExhaustedError,
    ProbeFailed,
    ReplyProtocolError,
    SentinelAuthenticationError,
    SentinelCacheError,
    SerializationError,
    ShardUnavailableError,
    StaleReplyError,
    ValueTooLargeError,
)
from sentinel_cache.version import __version__

# The core's two names Jedis users know, imported on first use so that ``import sentinel_cache``
# (exceptions only) stays light and connects nothing.
_LAZY = {
    "ShardedSentinelPool": "sentinel_cache.core.topology.sharded_pool",
    "HashRing": "sentinel_cache.core.ring",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'sentinel_cache' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


if TYPE_CHECKING:
    from sentinel_cache.core.ring import HashRing
    from sentinel_cache.core.topology.sharded_pool import ShardedSentinelPool

__all__ = [
    "ArgumentTypeError",
    "ArgumentValueError",
    "AuthenticationFailedError",
    "HashRing",
    "ShardedSentinelPool",
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
    "__version__",
]
