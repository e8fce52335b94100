"""Benchmarks: ``python -m benchmarks.run`` (``make bench``) measures this project against the
Redis caches Django and Flask users have today, on a real local Sentinel topology.

Nothing here is imported by the library; see ``docs/benchmarks-results.md`` for the latest table.
"""
