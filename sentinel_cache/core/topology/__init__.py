"""Who is master: shards, their fences and replicas, discovery, the listeners, the sharded pool.

Nothing here imports the operations (``core.ops``) or the operator tools (``core.admin``); the
connections in ``_async/`` (``_sync/`` generated from it) follow their shard's master.
"""
