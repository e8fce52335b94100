"""Warm adoption from django-redis (issue 25's target): a site on one plain redis server
through django-redis's ``DefaultClient`` (pickle, its own key function) switched to our cache
with ``PREVIOUS_CACHE``: every key read without a miss, 200 of 200 logged-in users still logged
in, and after ``sentinel_reshard --from-previous-cache`` every key on its shard and none left
on the old server. Also from a ``ShardClient`` over two servers (every server is scanned) and
from a ``SentinelClient`` (its master, found through its sentinel)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis
from adoption_support import old_url, run_scenario

from sentinel_cache.testing import LocalSentinelCluster

DJANGO_REDIS = "django_redis.cache.RedisCache"


@pytest.fixture(scope="module")
def old(server_kind: str) -> Iterator[LocalSentinelCluster]:
    """The servers the site ran on before: two plain redis nodes (the sentinel is not used)."""
    with LocalSentinelCluster(shards=2, replicas=0, sentinels=1) as topology:
        yield topology


def _servers(old: LocalSentinelCluster) -> list[redis.Redis]:
    clients = [old.node_client(old.master_address(name), db=0) for name in old.master_names]
    for client in clients:
        client.flushdb()
    return clients


def _check(figures: dict) -> None:
    print({k: v for k, v in figures.items() if k not in ("report", "second_run")})
    assert figures["old_keys_before"] == 800  # 600 keys and 200 sessions
    assert figures["misses"] == 0
    assert figures["ttl_kept"] == 150 and figures["persistent"] == 150
    assert figures["logged_in"] == figures["users"] == 200
    (report,) = figures["report"].values()
    assert report["complete"] and report["moved"] == 300 and report["already_present"] == 0
    (again,) = figures["second_run"].values()
    assert again["complete"] and again["scanned"] == 0
    assert figures["wrong_after"] == 0
    assert figures["on_their_shard"] == figures["keys"] == 800
    assert figures["left_on_old"] == 0


def test_switching_from_django_redis(
    cluster: LocalSentinelCluster, old: LocalSentinelCluster
) -> None:
    server, _ = _servers(old)
    entry = {
        "BACKEND": DJANGO_REDIS,
        "LOCATION": old_url(old),
        "OPTIONS": {"CLIENT_CLASS": "django_redis.client.DefaultClient"},
    }
    _check(run_scenario(cluster, [server], entry))


def test_switching_from_a_django_redis_shard_client(
    cluster: LocalSentinelCluster, old: LocalSentinelCluster
) -> None:
    servers = _servers(old)
    locations = [old_url(old, name=name) for name in old.master_names]
    entry = {
        "BACKEND": DJANGO_REDIS,
        "LOCATION": locations,
        "OPTIONS": {"CLIENT_CLASS": "django_redis.client.ShardClient"},
    }
    figures = run_scenario(cluster, servers, entry)
    assert all(n > 0 for n in figures["old_keys_per_server"]), figures["old_keys_per_server"]
    _check(figures)


def test_switching_from_a_django_redis_sentinel_client(
    cluster: LocalSentinelCluster, old: LocalSentinelCluster
) -> None:
    """The old cache found its master through Sentinel: its keys are scanned on that master."""
    server, _ = _servers(old)
    sentinels = [tuple(address) for address in old.sentinel_addresses]
    entry = {
        "BACKEND": DJANGO_REDIS,
        "LOCATION": f"redis://{old.master_names[0]}/0",
        "OPTIONS": {
            "CLIENT_CLASS": "django_redis.client.SentinelClient",
            "CONNECTION_FACTORY": "django_redis.pool.SentinelConnectionFactory",
            "SENTINELS": sentinels,
        },
    }
    _check(run_scenario(cluster, [server], entry))
