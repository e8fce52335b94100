"""docs/observability.md, Traces: the attribute table is what a span carries. A single-key call
and a multi-key call, traced on real servers: every attribute set is on the page, and
``db.operation.name`` is the first command of the batch, or the multi-key call's name."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from spans import EXPORTER, install, ours
from waiting import key_on

from sentinel_cache.core.ops.client import CacheClient
from sentinel_cache.core.serializers import Codec
from sentinel_cache.core.topology.sharded_pool import ShardedSentinelPool
from sentinel_cache.testing import LocalSentinelCluster

PAGE = Path(__file__).resolve().parent.parent / "docs" / "observability.md"


def documented_attributes() -> set[str]:
    text = PAGE.read_text(encoding="utf-8")
    table = text[text.index("| Attribute | Value |") :].split("\n\n", 1)[0]
    names: set[str] = set()
    for row in table.splitlines()[2:]:
        names.update(re.findall(r"`([a-z_.]+)`", row.split(" | ")[0]))
    return names


@pytest.fixture(scope="module", autouse=True)
def provider() -> None:
    install()


@pytest.fixture
def core(cluster: LocalSentinelCluster) -> Iterator[ShardedSentinelPool]:
    made = ShardedSentinelPool(cluster.master_names, cluster.sentinel_addresses, tracing=True)
    EXPORTER.clear()
    yield made
    made.close()


def test_the_attribute_table_is_what_a_span_carries(core: ShardedSentinelPool) -> None:
    documented = documented_attributes()
    assert {"db.operation.name", "sentinel_cache.shard", "error.type"} <= documented
    client = CacheClient(core, Codec())
    keys = [key_on(core, 0, "docs-trace"), key_on(core, 1, "docs-trace")]
    assert client.set(keys[0], "v", 60)
    assert client.get(keys[0]) == "v"
    assert client.get_many(keys) == {keys[0]: "v"}
    (single,) = ours("get")
    (many,) = ours("get_many")
    for span in (single, many):
        assert set(span.attributes) <= documented, set(span.attributes) - documented
    assert single.attributes["db.operation.name"] == "get"
    assert many.attributes["db.operation.name"] == "get_many"
    assert single.attributes["sentinel_cache.shard"] == core.shards[0].name
    assert sorted(many.attributes["sentinel_cache.shards"]) == sorted(s.name for s in core.shards)
