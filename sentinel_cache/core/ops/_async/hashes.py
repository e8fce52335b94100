"""Hash operations (django-redis's ``hset``, ``hdel``, ``hlen``, ``hkeys``, ``hexists``, plus
``hget``/``hgetall``), each routed to its key's shard; values go through the cache's codec as
every cached value does, fields are sent as they are.

The asyncio source; ``_sync/hashes.py`` is generated from it by ``scripts/unasync.py``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sentinel_cache.core.arguments import check_field
from sentinel_cache.core.ops._async.client import AsyncCacheOperations
from sentinel_cache.core.ops.plans import MISS, READ_MOVED, UPDATE, Command
from sentinel_cache.exceptions import ArgumentValueError


def field_name(field: Any) -> str:
    """A field as django-redis returns it: bytes decoded (UTF-8), anything else as it is."""
    return field.decode() if isinstance(field, bytes) else field


class AsyncHashOperations(AsyncCacheOperations):
    """Hashes: one key's fields on its shard (``UPDATE`` / ``READ_MOVED``)."""

    async def hset(
        self,
        key: Any,
        field: Any = None,
        value: Any = None,
        mapping: Mapping[Any, Any] | None = None,
    ) -> int:
        """Set ``field`` to ``value`` and/or every field of ``mapping``; the number of fields
        added (not counting those overwritten)."""
        pairs: list[Any] = []
        if field is not None:
            check_field("field", field)
            pairs += (field, self.encode(value))
        for name, item in (mapping or {}).items():
            check_field("mapping", name)
            pairs += (name, self.encode(item))
        if not pairs:
            raise ArgumentValueError("field", field, "hset needs a field or a mapping")
        command: Command = ("HSET", key, *pairs)
        (added,), _ = await self.keyed(key, [command], [0], UPDATE)
        return int(added)

    async def hdel(self, key: Any, *fields: Any) -> int:
        """Remove the fields; the number removed."""
        for field in fields:
            check_field("field", field)
        if not fields:
            return 0
        (removed,), _ = await self.keyed(key, [("HDEL", key, *fields)], [0], UPDATE)
        return int(removed)

    async def hlen(self, key: Any) -> int:
        (size,), _ = await self.keyed(key, [("HLEN", key)], [0], READ_MOVED)
        return int(size)

    async def hkeys(self, key: Any) -> list[Any]:
        (names,), _ = await self.keyed(key, [("HKEYS", key)], [[]], READ_MOVED)
        return [field_name(name) for name in names]

    async def hexists(self, key: Any, field: Any) -> bool:
        check_field("field", field)
        (found,), _ = await self.keyed(key, [("HEXISTS", key, field)], [0], READ_MOVED)
        return bool(found)

    async def hget(self, key: Any, field: Any, default: Any = None) -> Any:
        """The field's value, or ``default`` if the hash or the field is missing (or its value
        cannot be read: logged)."""
        check_field("field", field)
        (data,), _ = await self.keyed(key, [("HGET", key, field)], [None], READ_MOVED)
        return self.value_of(data, key, default)

    async def hgetall(self, key: Any) -> dict[Any, Any]:
        """Every field and its value (fields whose value cannot be read are left out, logged)."""
        (flat,), _ = await self.keyed(key, [("HGETALL", key)], [{}], READ_MOVED)
        items = flat.items() if isinstance(flat, dict) else zip(flat[::2], flat[1::2], strict=True)
        found = {}
        for name, data in items:
            value = self.decode(data, key)
            if value is not MISS:
                found[field_name(name)] = value
        return found
