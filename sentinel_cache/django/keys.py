"""Key functions for ``CACHES[...]["KEY_FUNCTION"]``."""

from __future__ import annotations

from typing import Any


def plain_key(key: Any, key_prefix: str, version: Any) -> str:
    """The key as given, with neither prefix nor version: what another program (a Java service
    through Jedis) calls the same entry. ``KEY_PREFIX`` and ``VERSION`` then mean nothing, and
    ``clear()`` without a prefix empties every shard's database."""
    return str(key)
