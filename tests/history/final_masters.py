"""The final read straight from the masters: once the dust settled, every key is read with the
raw redis-py client of its shard's current master (not through the cache) and decoded with the
default codec, as op ``final_master_get``. The checker judges it as the cache's own final read
(``lost-write``, ``counter``), so a bug on the cache's read path (a near-cache copy, a reply
from the wrong node, a value decoded wrong) cannot hide a lost write.

Skipped when the scenario reshards or adopts a previous cache (``PREVIOUS_MASTERS``,
``PREVIOUS_CACHE``): a key may then live on its previous owner or in the old cache, where only
the cache's read path knows to look.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from sentinel_cache.core.ring import HashRing
from sentinel_cache.core.serializers import Codec
from sentinel_cache.testing import LocalSentinelCluster

from .recorder import INFO, OK, OPS, Op, OpSpec, Read, Workload

ELSEWHERE = ("PREVIOUS_MASTERS", "PREVIOUS_CACHE")


def _final(op: Op) -> list[Any]:
    return [Read(op.keys[0], op.value, True)] if op.kind == OK else []


OPS["final_master_get"] = OpSpec(lambda r, w, v: ((), ()), lambda a, k, x: None, _final, weight=0)


def stored_key(adapter: str, key: str) -> str:
    """The key as the adapter stores it (Django: ``KEY_PREFIX:VERSION:key``, the recorder's
    Django cache has prefix ``hist`` and version 1)."""
    return f"hist:1:{key}" if adapter == "django" else key


def read_masters(
    cluster: LocalSentinelCluster, adapter: str, options: Mapping[str, Any], workload: Workload
) -> list[Op]:
    """One ``final_master_get`` per key of ``workload`` (none if the options move keys)."""
    if any(options.get(name) for name in ELSEWHERE):
        return []
    masters = list(options.get("MASTERS") or cluster.master_names)
    ring = HashRing([1] * len(masters))
    codec = Codec()
    clients: dict[str, Any] = {}
    out: list[Op] = []
    try:
        for n, key in enumerate((*workload.keys, *workload.counters)):
            name = masters[ring.shard_index(stored_key(adapter, key))]
            if name not in clients:
                address = cluster.master_address(name)
                clients[name] = cluster.node_client(address, direct=True, socket_timeout=5)
            invoke = time.monotonic()
            try:
                data = clients[name].get(stored_key(adapter, key))
                value, kind, error = codec.loads(data) if data is not None else None, OK, ""
            except Exception as exc:  # noqa: BLE001 - recorded, never trusted
                value, kind, error = None, INFO, f"{type(exc).__name__}: {exc}"[:300]
            out.append(
                Op(
                    0,
                    "masters",
                    n,
                    "final_master_get",
                    (key,),
                    (),
                    invoke,
                    time.monotonic(),
                    kind,
                    value,
                    error,
                )
            )
    finally:
        for client in clients.values():
            client.close()
    return out
