"""sentinel_cache: one cache over a sharded set of Sentinel-managed Redis masters."""

from sentinel_cache.exceptions import (
    AuthenticationFailedError,
    ConfigurationError,
    DataNodeAuthenticationError,
    DiscoveryError,
    FailoverInProgressError,
    MasterNotFoundError,
    NoSentinelReachableError,
    PoolExhaustedError,
    SentinelAuthenticationError,
    SentinelCacheError,
    SerializationError,
    ShardUnavailableError,
    StaleReplyError,
)

__version__ = "0.1.0"

__all__ = [
    "AuthenticationFailedError",
    "ConfigurationError",
    "DataNodeAuthenticationError",
    "DiscoveryError",
    "FailoverInProgressError",
    "MasterNotFoundError",
    "NoSentinelReachableError",
    "PoolExhaustedError",
    "SentinelAuthenticationError",
    "SentinelCacheError",
    "SerializationError",
    "ShardUnavailableError",
    "StaleReplyError",
    "__version__",
]
