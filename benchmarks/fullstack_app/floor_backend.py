"""The full stack's reference: the least a Python Django backend can do for the view's calls.

:class:`FloorCache` is Django's ``BaseCache`` (its key making and checking) over the benchmark's
floor (:class:`benchmarks.floor.Floor`: blocking sockets, one connection per thread in flight,
``hiredis``, pickle; under asyncio, streams of the running loop). No Sentinel, no failover
rule, no reply check, no timeout but the floor's fixed one: it is not a cache anybody should
run, it is what a request costs with nothing of ours in it, so the report can say how far ours
is from the Python round trip itself (issue 37) where it trails a native driver. One plain
server (``LOCATION`` ``host:port``); every backend object built from the same ``LOCATION``
shares one floor, as Django builds one per thread and one per ASGI request.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import Any

from django.core.cache.backends.base import DEFAULT_TIMEOUT, BaseCache

from benchmarks.floor import Floor

_floors: dict[str, Floor] = {}
_lock = threading.Lock()


def shared_floor(location: str) -> Floor:
    """The one floor of this process for ``location`` (``host:port``)."""
    with _lock:
        floor = _floors.get(location)
        if floor is None:
            host, _, port = location.rpartition(":")
            if not host or not port.isdigit():
                raise ValueError(f"FloorCache LOCATION must be 'host:port', not {location!r}")
            floor = _floors[location] = Floor([(host, int(port))])
        return floor


class FloorCache(BaseCache):
    """``get``, ``get_many``, ``set``, ``incr`` and their async twins on the floor (what the
    full-stack view calls; ``incr`` by 1 only). ``set`` stores with the floor's fixed expiry
    whatever the timeout, and ``incr`` of a missing key makes it (the view fills every key
    first)."""

    def __init__(self, location: str, params: dict[str, Any]) -> None:
        super().__init__(params)
        self._floor = shared_floor(location)

    def __repr__(self) -> str:
        return f"<FloorCache {self._floor.addresses[0]}>"

    def get(self, key: Any, default: Any = None, version: Any = None) -> Any:
        value = self._floor.get(self.make_and_validate_key(key, version=version))
        return default if value is None else value

    def set(
        self, key: Any, value: Any, timeout: Any = DEFAULT_TIMEOUT, version: Any = None
    ) -> None:
        self._floor.set(self.make_and_validate_key(key, version=version), value)

    def _made(self, keys: Iterable[Any], version: Any) -> dict[str, Any]:
        """Stored key -> the caller's."""
        return {self.make_and_validate_key(key, version=version): key for key in keys}

    def get_many(self, keys: Iterable[Any], version: Any = None) -> dict[Any, Any]:
        made = self._made(keys, version)
        if not made:
            return {}
        return {made[k]: v for k, v in self._floor.get_many(list(made)).items()}

    def incr(self, key: Any, delta: int = 1, version: Any = None) -> int:
        _by_one(delta)
        return int(self._floor.incr(self.make_and_validate_key(key, version=version)))

    def delete_many(self, keys: Iterable[Any], version: Any = None) -> None:
        made = [self.make_and_validate_key(key, version=version) for key in keys]
        if made:
            self._floor.delete_many(made)

    async def aget(self, key: Any, default: Any = None, version: Any = None) -> Any:
        value = await self._floor.aget(self.make_and_validate_key(key, version=version))
        return default if value is None else value

    async def aset(
        self, key: Any, value: Any, timeout: Any = DEFAULT_TIMEOUT, version: Any = None
    ) -> None:
        await self._floor.aset(self.make_and_validate_key(key, version=version), value)

    async def aget_many(self, keys: Iterable[Any], version: Any = None) -> dict[Any, Any]:
        made = self._made(keys, version)
        if not made:
            return {}
        return {made[k]: v for k, v in (await self._floor.aget_many(list(made))).items()}

    async def aincr(self, key: Any, delta: int = 1, version: Any = None) -> int:
        _by_one(delta)
        return int(await self._floor.aincr(self.make_and_validate_key(key, version=version)))


def _by_one(delta: int) -> None:
    if delta != 1:
        raise ValueError(f"FloorCache increments by 1 only, not {delta!r}")
