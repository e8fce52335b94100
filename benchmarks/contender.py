"""What every contender shares: the base adapter, the topology it connects to, the timeouts.

Apart from the registry in :mod:`benchmarks.contenders`, so that a contender written in its own
module (the floor) builds on it without importing the registry that lists it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

TIMEOUT = 300  # seconds, every contender's default timeout
# The same sentinel/data-node socket timeouts as sentinel_cache's defaults, for everyone.
SENTINEL_KWARGS = {"socket_timeout": 0.5, "socket_connect_timeout": 0.5}
NODE_KWARGS = {"socket_timeout": 5.0, "socket_connect_timeout": 2.0}


@dataclass(frozen=True)
class Topology:
    """What a contender needs to connect: sentinels, ordered master names, master addresses."""

    sentinels: tuple[tuple[str, int], ...]
    masters: tuple[str, ...]
    master_addresses: tuple[tuple[str, int], ...]

    @property
    def sentinel_strings(self) -> list[str]:
        return [f"{h}:{p}" for h, p in self.sentinels]

    @classmethod
    def of(cls, cluster: Any) -> Topology:
        return cls(
            sentinels=tuple(tuple(a) for a in cluster.sentinel_addresses),
            masters=tuple(cluster.master_names),
            master_addresses=tuple(tuple(cluster.master_address(n)) for n in cluster.master_names),
        )


class Contender:
    """Base adapter; subclasses wrap one cache object."""

    has_async = False

    def get(self, key: str) -> Any:
        raise NotImplementedError

    def set(self, key: str, value: Any) -> Any:
        raise NotImplementedError

    def get_many(self, keys: Sequence[str]) -> Any:
        raise NotImplementedError

    def set_many(self, mapping: Mapping[str, Any]) -> Any:
        raise NotImplementedError

    def delete_many(self, keys: Sequence[str]) -> Any:
        raise NotImplementedError

    def incr(self, key: str) -> Any:
        raise NotImplementedError

    async def aget(self, key: str) -> Any:
        raise NotImplementedError

    async def aset(self, key: str, value: Any) -> Any:
        raise NotImplementedError

    async def aclose(self) -> None:
        """Close what the async calls opened in the running loop (before the loop ends)."""

    def close(self) -> None:
        pass
