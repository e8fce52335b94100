"""The metrics table of docs/observability.md is what a scrape gives: every series the page names
exists with its type and labels, and every series the library exports is on the page.

A real core with ``METRICS`` and ``NEAR_CACHE`` on, on a private topology (its ``clear()``
empties it), is used for a few calls so that the series read at scrape time (connections,
listeners, near cache) have samples; a series with no sample yet is checked against the labels
it is declared with (``sentinel_cache.prometheus.FAMILIES``).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

from prometheus_client import REGISTRY
from waiting import key_on, wait_until

from sentinel_cache.core.ops.client import CacheClient
from sentinel_cache.core.serializers import Codec
from sentinel_cache.core.topology.sharded_pool import ShardedSentinelPool
from sentinel_cache.prometheus import FAMILIES
from sentinel_cache.testing import LocalSentinelCluster

PAGE = Path(__file__).resolve().parent.parent / "docs" / "observability.md"
ROW = re.compile(r"^\| `(sentinel_cache_[a-z_]+)` \| (\w+) \| ([^|]*) \|")


def documented() -> dict[str, tuple[str, frozenset[str]]]:
    """Series name -> (type, label names), from the page's metrics table."""
    rows: dict[str, tuple[str, frozenset[str]]] = {}
    for line in PAGE.read_text(encoding="utf-8").splitlines():
        row = ROW.match(line)
        if row:
            assert row[1] not in rows, f"{row[1]} is documented twice"
            rows[row[1]] = (row[2], frozenset(re.findall(r"`(\w+)`", row[3])))
    return rows


def scraped() -> dict[str, tuple[str, frozenset[str] | None]]:
    """Series name (a counter's with ``_total``) -> (type, label names or None if unknown)."""
    declared = {family.name: frozenset(family.labels) for family in FAMILIES}
    found: dict[str, tuple[str, frozenset[str] | None]] = {}
    for metric in REGISTRY.collect():
        if not metric.name.startswith("sentinel_cache_"):
            continue
        name = f"{metric.name}_total" if metric.type == "counter" else metric.name
        labels: set[str] = set()
        for sample in metric.samples:
            if not sample.name.endswith("_created"):
                labels.update(sample.labels)
        labels.discard("le")  # a histogram's buckets
        found[name] = (metric.type, frozenset(labels) if labels else declared.get(metric.name))
    return found


def test_the_metrics_table_is_what_a_scrape_gives(
    make_cluster: Callable[..., LocalSentinelCluster],
) -> None:
    cluster = make_cluster(shards=1, replicas=1, sentinels=1)
    core = ShardedSentinelPool(
        cluster.master_names, cluster.sentinel_addresses, metrics=True, near_cache=True
    )
    try:
        core.discover()
        client = CacheClient(core, Codec())
        wait_until(lambda: core.near is not None and core.near.status(0)["tracked"], 10, "tracking")
        wait_until(lambda: all(core.listener_states().values()), 10, "the listener")
        key = key_on(core, 0, "docs-metrics")
        assert client.set(key, "v", 60)
        assert client.get(key) == "v"  # kept as a near copy
        assert client.get(key) == "v"  # a near-cache hit
        assert client.get_many([key, f"{key}:missing"]) == {key: "v"}
        assert client.clear(None)  # FLUSHDB: a near-cache flush, cause "clear"
        pages, scrape = documented(), scraped()
    finally:
        core.close()

    assert len(pages) >= 15, "the page's table was not found"
    assert sorted(set(pages) - set(scrape)) == [], "on the page, not exported"
    assert sorted(set(scrape) - set(pages)) == [], "exported, not on the page"
    wrong = [
        f"{name}: the page says {pages[name]}, a scrape gives {scrape[name]}"
        for name in pages
        if scrape[name] != pages[name]
    ]
    assert wrong == [], "\n".join(wrong)
