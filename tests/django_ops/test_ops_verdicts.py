"""Verdicts that match reality (issue 38): ``check --deploy`` fails when no sentinel answers and
when an address of LOCATION is a Redis data node, naming it and what LOCATION must hold; it lists
the sentinels that answered and the masters they named; ``sentinel_status`` marks a data node
"NOT A SENTINEL"; a process that runs no pool says "not started" in the listener and last-switch
columns (Flask's command says the same: tests/flask/test_flask_cli.py)."""

from __future__ import annotations

import json
from io import StringIO
from typing import Any

import pytest
from django.core import checks
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from ops_support import UseCaches, closed_port, hostport, sentinel_cache, status

from sentinel_cache.django.checks import check_deployment
from sentinel_cache.testing import LocalSentinelCluster


def _by_id(messages: list[checks.CheckMessage]) -> dict[str, checks.CheckMessage]:
    found = {m.id: m for m in messages}
    assert len(found) == len(messages), messages
    return found


def _data_nodes(cluster: LocalSentinelCluster) -> list[str]:
    return [hostport(cluster.master_address(name)) for name in cluster.master_names]


def test_deploy_fails_when_location_holds_the_data_nodes(
    cluster: LocalSentinelCluster, use_caches: UseCaches
) -> None:
    nodes = _data_nodes(cluster)
    use_caches(sessions=sentinel_cache(nodes, cluster.master_names))
    found = _by_id(check_deployment(None))
    assert set(found) == {"sentinel_cache.W001", "sentinel_cache.E005", "sentinel_cache.E006"}
    error = found["sentinel_cache.E006"]
    assert error.level == checks.ERROR
    assert "2 of 2 addresses in LOCATION are Redis data nodes, not sentinels: " in error.msg
    assert all(f"{node} (ROLE master, not a sentinel: " in error.msg for node in nodes)
    assert "LOCATION must hold the sentinels' host:port" in (error.hint or "")
    assert found["sentinel_cache.E005"].level == checks.ERROR
    assert "no sentinel answered" in found["sentinel_cache.E005"].msg
    assert "+sentinel|master" not in " ".join(f"{m.msg} {m.hint}" for m in found.values())
    with pytest.raises(SystemCheckError, match=r"sessions: \(sentinel_cache.E006\)"):
        call_command("check", "--deploy", "--tag", "sentinel_cache", stdout=StringIO())


def test_deploy_fails_when_no_sentinel_answers(use_caches: UseCaches) -> None:
    dead = [f"127.0.0.1:{closed_port()}" for _ in range(3)]
    use_caches(sessions=sentinel_cache(dead))
    found = _by_id(check_deployment(None))
    assert set(found) == {"sentinel_cache.E005"}  # not W002: nothing can serve
    error = found["sentinel_cache.E005"]
    assert error.level == checks.ERROR
    assert "none of the 3 addresses in LOCATION is a sentinel this machine can ask" in error.msg
    assert all(address in error.msg for address in dead)
    with pytest.raises(SystemCheckError, match=r"sessions: \(sentinel_cache.E005\)"):
        call_command("check", "--deploy", "--tag", "sentinel_cache", stdout=StringIO())


def test_deploy_names_the_data_node_among_real_sentinels_and_lists_who_answered(
    cluster: LocalSentinelCluster, use_caches: UseCaches
) -> None:
    sentinels = [hostport(a) for a in cluster.sentinel_addresses]
    node = _data_nodes(cluster)[0]
    use_caches(sessions=sentinel_cache([*sentinels, node], cluster.master_names))
    found = _by_id(check_deployment(None))
    assert set(found) == {"sentinel_cache.E006", "sentinel_cache.I001"}
    assert "1 of 4 addresses in LOCATION is a Redis data node, not a sentinel: " in (
        found["sentinel_cache.E006"].msg
    )
    assert node in found["sentinel_cache.E006"].msg
    info = found["sentinel_cache.I001"]
    assert info.level == checks.INFO
    assert info.msg.startswith("3 of 4 sentinels answered: ")
    named = ", ".join(
        f"{name} -> {hostport(cluster.master_address(name))}" for name in cluster.master_names
    )
    assert all(f"{s} ({named})" in info.msg for s in sentinels), info.msg
    assert info.msg.count(f" ({named})") == 3  # the data node named nothing


def test_status_marks_a_data_node_not_a_sentinel(
    cluster: LocalSentinelCluster, use_caches: UseCaches
) -> None:
    sentinels = [hostport(a) for a in cluster.sentinel_addresses]
    node = _data_nodes(cluster)[0]
    use_caches(default=sentinel_cache([*sentinels, node], cluster.master_names))
    code, text = status()
    assert code == 1, text  # degraded: the real sentinels still name every master
    row = next(line for line in text.splitlines() if line.startswith(node))
    assert "NOT A SENTINEL" in row
    assert (
        f"sentinel {node} is not a sentinel: {node} (ROLE master): it answers as a Redis " in text
    )
    code, out = status("--json")
    report: dict[str, Any] = json.loads(out)["default"]
    (entry,) = [s for s in report["sentinels"] if s["address"] == node]
    assert entry["state"] == "not_sentinel" and entry["role"] == "master"
    assert not entry["reachable"]
    assert "allow +sentinel|master" not in out


def test_status_of_data_nodes_only_is_down_and_says_why(
    cluster: LocalSentinelCluster, use_caches: UseCaches
) -> None:
    use_caches(default=sentinel_cache(_data_nodes(cluster), cluster.master_names))
    code, text = status()
    assert code == 2, text
    for name in cluster.master_names:
        row = next(line for line in text.splitlines() if f"({name}): " in line)
        assert (
            "no sentinel answered" in row
            and "not a sentinel (a Redis data node, ROLE master)" in row
        )
    assert text.count("NOT A SENTINEL") == 2


def test_a_process_without_a_pool_says_not_started(
    cluster: LocalSentinelCluster, use_caches: UseCaches
) -> None:
    use_caches(default=sentinel_cache([hostport(a) for a in cluster.sentinel_addresses]))
    code, text = status()
    assert code in (0, 1), text
    shard_rows = [line for line in text.splitlines() if line.startswith(("0 ", "1 "))]
    assert len(shard_rows) == 2 and all("not started" in row for row in shard_rows)
    sentinel_rows = [
        line
        for line in text.splitlines()
        if line.startswith(hostport(cluster.sentinel_addresses[0]))
    ]
    assert sentinel_rows and "not started" in sentinel_rows[0]
