"""``get_or_set_many`` through Flask-Caching's backend: the same core operation as Django's."""

from __future__ import annotations

from sentinel_cache.flask import ShardedSentinelCache


def test_get_or_set_many(backend: ShardedSentinelCache) -> None:
    backend.set("fgosm0", "old")
    got = backend.get_or_set_many({"fgosm0": "new", "fgosm1": "new", "fgosm2": 2})
    assert got == {"fgosm0": "old", "fgosm1": "new", "fgosm2": 2}
    assert backend.get_many("fgosm1", "fgosm2") == ["new", 2]
    assert backend.get_or_set_many({}) == {}
