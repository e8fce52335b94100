"""The cache operations on top of the topology: plans (sans-I/O), the safety net, the clients.

Every operation is written once in ``_async/client.py`` (``_sync/`` is generated from it); each
flavour's own I/O is in ``async_io.py`` / ``sync_io.py`` beside it.
"""
