"""Local Sentinel topologies for tests, the demo and users (stdlib + redis-py only, starts nothing)."""

from sentinel_cache.testing.cluster import BlackHoleServer, LocalSentinelCluster, find_server_binary

__all__ = ["BlackHoleServer", "LocalSentinelCluster", "find_server_binary"]
