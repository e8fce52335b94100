"""sentinel_cache: one cache over a sharded set of Sentinel-managed Redis masters."""

from sentinel_cache.exceptions import (
    ConfigurationError,
    DiscoveryError,
    FailoverInProgressError,
    MasterNotFoundError,
    NoSentinelReachableError,
    PoolExhaustedError,
    SentinelCacheError,
    SerializationError,
    ShardUnavailableError,
)

__version__ = "0.1.0"

__all__ = [
    "ConfigurationError",
    "DiscoveryError",
    "FailoverInProgressError",
    "MasterNotFoundError",
    "NoSentinelReachableError",
    "PoolExhaustedError",
    "SentinelCacheError",
    "SerializationError",
    "ShardUnavailableError",
    "__version__",
]
