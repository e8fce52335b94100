"""``manage.py sentinel_status``: text, JSON, alias selection, watch mode and exit codes."""

from __future__ import annotations

import json
from collections.abc import Callable
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from ops_support import UseCaches, closed_port, cluster_cache, hostport, sentinel_cache

from sentinel_cache.management.commands import sentinel_status
from sentinel_cache.management.commands.sentinel_status import CLEAR_SCREEN
from sentinel_cache.testing import LocalSentinelCluster

ClusterFactory = Callable[..., LocalSentinelCluster]


def _run(*args: str, **options: Any) -> tuple[int, str]:
    """Run the command; returns (exit code, stdout)."""
    out = StringIO()
    try:
        call_command("sentinel_status", *args, stdout=out, **options)
    except SystemExit as exc:
        return int(exc.code or 0), out.getvalue()
    return 0, out.getvalue()


def test_text_table_for_every_sentinel_alias(
    cluster: LocalSentinelCluster, use_caches: UseCaches
) -> None:
    use_caches(sessions=cluster_cache(cluster))
    code, out = _run()
    assert code == 0, out
    assert out.startswith("cache 'sessions': HEALTHY (exit 0)")
    assert "'default'" not in out  # the locmem default is not ours
    for name in cluster.master_names:
        line = next(line for line in out.splitlines() if f" {name} " in line)
        assert hostport(cluster.master_address(name)) in line
    for address in cluster.sentinel_addresses:
        assert hostport(address) in out


def test_json_is_one_object_keyed_by_alias(
    cluster: LocalSentinelCluster, use_caches: UseCaches
) -> None:
    use_caches(a=cluster_cache(cluster), b=cluster_cache(cluster, DB=8))
    code, out = _run("--json")
    assert code == 0, out
    reports = json.loads(out)
    assert set(reports) == {"a", "b"}
    for report in reports.values():
        assert report["state"] == "healthy" and report["exit_code"] == 0
        assert [s["name"] for s in report["shards"]] == cluster.master_names
        assert [s["address"] for s in report["shards"]] == [
            hostport(cluster.master_address(name)) for name in cluster.master_names
        ]


def test_cache_option_selects_one_alias(
    cluster: LocalSentinelCluster, use_caches: UseCaches
) -> None:
    use_caches(a=cluster_cache(cluster), b=cluster_cache(cluster, DB=8))
    code, out = _run("--json", "--cache", "b")
    assert code == 0
    assert list(json.loads(out)) == ["b"]


def test_unknown_alias_is_a_command_error(
    cluster: LocalSentinelCluster, use_caches: UseCaches
) -> None:
    use_caches(sessions=cluster_cache(cluster))
    with pytest.raises(CommandError, match=r"unknown cache alias 'nope'.*default, sessions"):
        _run("--cache", "nope")


def test_alias_of_another_backend_is_a_command_error(
    cluster: LocalSentinelCluster, use_caches: UseCaches
) -> None:
    use_caches(sessions=cluster_cache(cluster))
    with pytest.raises(CommandError, match=r"'default' uses .*LocMemCache"):
        _run("--cache", "default")


def test_no_sentinel_cache_at_all_is_a_command_error(use_caches: UseCaches) -> None:
    use_caches()
    with pytest.raises(CommandError, match="no cache in settings.CACHES uses"):
        _run()


def test_broken_configuration_is_a_command_error(use_caches: UseCaches) -> None:
    use_caches(bad=sentinel_cache(["127.0.0.1:26379"], MASTER_NAMES=["a"]))
    with pytest.raises(CommandError, match="MASTER_NAMES") as raised:
        _run()
    assert raised.value.returncode == 3  # configuration error, not 1 ("degraded")


def _run_from_argv(*args: str) -> tuple[int, str]:
    """As ``manage.py sentinel_status ARGS`` does; returns (exit code, stderr)."""
    err = StringIO()
    command = sentinel_status.Command(stderr=err)
    with pytest.raises(SystemExit) as raised:
        command.run_from_argv(["manage.py", "sentinel_status", *args])
    return int(raised.value.code or 0), err.getvalue()


def test_configuration_error_exits_3_from_the_command_line(use_caches: UseCaches) -> None:
    use_caches(bad=sentinel_cache(["127.0.0.1:26379"], WEIGTHS=[1, 2]))
    code, err = _run_from_argv()
    assert code == 3
    assert "cache 'bad'" in err and "WEIGTHS" in err


def test_missing_or_unknown_alias_exits_3(use_caches: UseCaches) -> None:
    use_caches()
    assert _run_from_argv()[0] == 3
    assert _run_from_argv("--cache", "nope")[0] == 3


def test_usage_errors_exit_3_not_2(
    use_caches: UseCaches, capsys: pytest.CaptureFixture[str]
) -> None:
    use_caches(sessions=sentinel_cache(["127.0.0.1:26379"]))
    assert _run_from_argv("--timeout", "0")[0] == 3
    with pytest.raises(SystemExit) as raised:  # argparse's own error, before handle()
        sentinel_status.Command().run_from_argv(
            ["manage.py", "sentinel_status", "--fail-on", "sometimes"]
        )
    assert raised.value.code == 3
    assert "invalid choice: 'sometimes'" in capsys.readouterr().err


@pytest.mark.failover
def test_stopped_sentinel_exits_1(make_cluster: ClusterFactory, use_caches: UseCaches) -> None:
    cluster = make_cluster(shards=1, replicas=1, sentinels=3)
    cluster.stop_sentinel(0)
    use_caches(sessions=cluster_cache(cluster))
    code, out = _run()
    assert code == 1
    assert "DEGRADED (exit 1)" in out
    assert hostport(cluster.sentinel_addresses[0]) in out
    # A readiness probe: every shard serves, the missing sentinel is a warning.
    code, out = _run("--fail-on", "down")
    assert code == 0
    assert "DEGRADED (exit 0: fail on down only" in out
    assert "warnings (redundancy reduced):" in out
    assert f"sentinel {hostport(cluster.sentinel_addresses[0])} unreachable" in out


@pytest.mark.failover
def test_fail_on_down_right_after_a_planned_failover(
    make_cluster: ClusterFactory, use_caches: UseCaches
) -> None:
    cluster = make_cluster(shards=1, replicas=1, sentinels=3)
    use_caches(sessions=cluster_cache(cluster))
    assert _run()[0] == 0
    old = cluster.master_address("shard0")
    cluster.failover("shard0")
    new = cluster.wait_for_master_change("shard0", old)
    # The sentinels convert the old master into a replica about 10 s later; frozen, it stays
    # unconverted while the command runs, as a probe right after the failover sees it.
    cluster.freeze_node(old)
    try:
        default_code, default_out = _run("--timeout", "0.5")
        code, out = _run("--fail-on", "down", "--timeout", "0.5", "--json")
    finally:
        cluster.thaw_node(old)
    assert default_code == 1
    assert "no replica online" in default_out
    assert code == 0
    report = json.loads(out)["sessions"]
    assert report["state"] == "degraded" and report["exit_code"] == 0
    assert report["fail_on"] == "down"
    (shard,) = report["shards"]
    assert shard["address"] == hostport(new) and shard["role"] == "master"
    assert shard["config_epoch"] >= 1  # this process saw no switch; the sentinels' epoch did


def test_not_monitored_master_exits_2_and_says_so(
    cluster: LocalSentinelCluster, use_caches: UseCaches
) -> None:
    entry = cluster_cache(cluster)
    entry["OPTIONS"]["MASTERS"] = [*cluster.master_names, "not-monitored"]
    use_caches(sessions=entry)
    code, out = _run("--fail-on", "down")
    assert code == 2
    assert "shard 2 (not-monitored): not monitored: no sentinel monitors master" in out
    assert "no sentinel reachable" not in out
    code, out = _run("--json")
    assert code == 2
    lost = json.loads(out)["sessions"]["shards"][2]
    assert lost["problem"] == "not_monitored"
    assert lost["sentinels_not_monitoring"] == [hostport(a) for a in cluster.sentinel_addresses]


def test_worst_alias_decides_the_exit_code(
    cluster: LocalSentinelCluster, use_caches: UseCaches
) -> None:
    use_caches(
        good=cluster_cache(cluster),
        lost=sentinel_cache([f"127.0.0.1:{closed_port()}"], ["nowhere"]),
    )
    code, out = _run("--json", "--timeout", "0.3")
    assert code == 2
    assert _run("--json", "--timeout", "0.3", "--fail-on", "down")[0] == 2
    reports = json.loads(out)
    assert reports["good"]["state"] == "healthy"
    assert reports["lost"]["state"] == "down"
    assert reports["lost"]["shards"][0]["address"] is None


def test_watch_refreshes_until_stopped(
    cluster: LocalSentinelCluster, use_caches: UseCaches
) -> None:
    use_caches(sessions=cluster_cache(cluster))
    code, out = _run("--watch", "0.05", "--iterations", "3")
    assert code == 0
    assert out.count(CLEAR_SCREEN) == 3
    assert out.count("cache 'sessions': HEALTHY") == 3


def test_watch_json_streams_one_object_per_line(
    cluster: LocalSentinelCluster, use_caches: UseCaches
) -> None:
    use_caches(sessions=cluster_cache(cluster))
    code, out = _run("--json", "--watch", "0.05", "--iterations", "2")
    assert code == 0
    assert CLEAR_SCREEN not in out
    lines = out.splitlines()
    assert len(lines) == 2
    assert all(json.loads(line)["sessions"]["state"] == "healthy" for line in lines)


def test_bad_numbers_are_command_errors(use_caches: UseCaches) -> None:
    use_caches(sessions=sentinel_cache(["127.0.0.1:26379"]))
    with pytest.raises(CommandError, match="--timeout"):
        _run("--timeout", "0")
    with pytest.raises(CommandError, match="--watch"):
        _run("--watch", "-1")


def test_ctrl_c_ends_watch_with_the_last_code(
    cluster: LocalSentinelCluster, use_caches: UseCaches, monkeypatch: pytest.MonkeyPatch
) -> None:
    def interrupt(seconds: float) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(sentinel_status.time, "sleep", interrupt)
    use_caches(sessions=cluster_cache(cluster))
    code, out = _run("--watch")
    assert code == 0
    assert out.count("HEALTHY") == 1
    assert "refreshing every 2s" in out
