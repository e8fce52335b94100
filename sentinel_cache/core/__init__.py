"""The framework-free core; nothing here imports Django or Flask, nothing connects at import.

``config`` parses options once into frozen objects; ``ring`` places keys as Jedis does;
``discovery`` asks the sentinels; ``listener`` follows their events; ``shard`` holds one master's
connection pool, write fence and replicas; ``sharded_pool`` is the core that owns the shards
(``ShardedSentinelPool``), with ``registry`` sharing it per process; ``housekeeping`` runs its
timers; ``plans`` is the sans-I/O layer of the cache operations, which ``_async/client.py``
defines once (``_sync/`` is generated from it) and ``client``/``aio`` expose; ``serializers``
encode values; ``status`` builds the health report.
"""
