"""The framework-free core; nothing here imports Django or Flask, nothing connects at import.

Layers, each importing only those below it (``tests/test_layers.py`` checks it):

- ``admin/``: operator tools (status, health, resharding);
- ``ops/``: the cache operations (plans, the clients, observation);
- ``topology/``: who is master (shards, discovery, listeners, the sharded pool, the near cache's
  trackers);
- the foundation beside this file: ``config`` parses options once into frozen objects,
  ``ring`` places keys as Jedis does, ``serializers`` encode values, ``arguments`` checks them,
  ``metrics`` and ``throttle``.
"""
