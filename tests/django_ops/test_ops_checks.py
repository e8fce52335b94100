"""System checks: configuration errors without connecting, and ``check --deploy`` warnings."""

from __future__ import annotations

import time
from collections.abc import Callable
from io import StringIO
from typing import Any

import pytest
from django.core import checks
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from ops_support import UseCaches, closed_port, cluster_cache, hostport, sentinel_cache

from sentinel_cache.django.checks import check_configuration, check_deployment
from sentinel_cache.testing import BlackHoleServer, LocalSentinelCluster

ClusterFactory = Callable[..., LocalSentinelCluster]


def _check(*args: str) -> str:
    """``manage.py check ARGS``; returns what it printed (warnings go to stderr)."""
    out, err = StringIO(), StringIO()
    call_command("check", *args, stdout=out, stderr=err)
    return out.getvalue() + err.getvalue()


def _problems(messages: list[checks.CheckMessage]) -> list[checks.CheckMessage]:
    """The messages but I001 (which sentinels answered, on every deploy check that reached one)."""
    return [m for m in messages if m.id != "sentinel_cache.I001"]


def test_app_registers_its_checks() -> None:
    registered = checks.registry.registry.get_checks(include_deployment_checks=True)
    assert check_configuration in registered
    assert check_deployment in registered
    assert check_deployment not in checks.registry.registry.get_checks()
    assert "sentinel_cache" in checks.registry.registry.tags_available()


def test_valid_configuration_passes_without_connecting(use_caches: UseCaches) -> None:
    # Nothing listens there: a check that connected would fail or hang.
    use_caches(sessions=sentinel_cache([f"127.0.0.1:{closed_port()}"]))
    assert "no issues" in _check()


def test_bad_configuration_is_E001_naming_the_field(use_caches: UseCaches) -> None:
    use_caches(
        sessions=sentinel_cache(["127.0.0.1:26379"], WEIGTHS=[1, 2]),
        other_locmem={"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
    )
    with pytest.raises(SystemCheckError) as raised:
        _check("--tag", "sentinel_cache")
    message = str(raised.value)
    assert "sessions: (sentinel_cache.E001)" in message
    assert "WEIGTHS" in message and "did you mean 'WEIGHTS'" in message
    assert "other_locmem" not in message


def test_plain_check_reports_E001_too(use_caches: UseCaches) -> None:
    # Django's own caches.W003 check builds every cache (caches[alias]): this relies on the
    # backend deferring its ImproperlyConfigured to first use, so E001 gets printed.
    use_caches(sessions=sentinel_cache(["127.0.0.1:26379"], WEIGTHS=[1, 2]))
    with pytest.raises(SystemCheckError, match=r"sessions: \(sentinel_cache.E001\).*WEIGTHS"):
        _check()


@pytest.mark.parametrize(
    ("location", "options", "field"),
    [
        (["127.0.0.1:26379"], {}, "MASTERS"),
        (["127.0.0.1:notaport"], {"MASTERS": ["a"]}, "LOCATION"),
        ("127.0.0.1:26379", {"MASTERS": ["a", "b"], "WEIGHTS": [1]}, "weights"),
        (["127.0.0.1:26379"], {"MASTERS": ["a"], "SOCKET_TIMEOUT": -1}, "SOCKET_TIMEOUT"),
        (
            ["127.0.0.1:26379"],
            {"MASTERS": ["a"], "CONNECTION_KWARGS": {"sockettimeout": 1}},
            "socket_timeout",
        ),
        (None, {"MASTERS": ["a"]}, "LOCATION"),
    ],
)
def test_E001_messages(
    use_caches: UseCaches, location: Any, options: dict[str, Any], field: str
) -> None:
    use_caches(
        sessions={
            "BACKEND": "sentinel_cache.django.ShardedSentinelCache",
            "LOCATION": location,
            "OPTIONS": options,
        }
    )
    (error,) = check_configuration(None)
    assert error.id == "sentinel_cache.E001"
    assert error.obj == "sessions"
    assert error.level == checks.ERROR
    assert field in error.msg


def test_options_that_are_not_a_dict_are_reported_not_raised(use_caches: UseCaches) -> None:
    use_caches(
        sessions={
            "BACKEND": "sentinel_cache.django.ShardedSentinelCache",
            "LOCATION": "127.0.0.1:26379",
            "OPTIONS": ["MASTERS"],
        }
    )
    (error,) = check_configuration(None)
    assert error.id == "sentinel_cache.E001"


def test_deploy_warns_about_fewer_than_three_sentinels(
    cluster: LocalSentinelCluster, use_caches: UseCaches
) -> None:
    two = [hostport(a) for a in cluster.sentinel_addresses[:2]]
    use_caches(sessions=sentinel_cache(two, cluster.master_names))
    output = _check("--deploy", "--tag", "sentinel_cache")
    assert "sessions: (sentinel_cache.W001)" in output
    assert "only 2 sentinels" in output
    assert "W002" not in output


def test_deploy_is_quiet_for_three_reachable_sentinels(
    cluster: LocalSentinelCluster, use_caches: UseCaches
) -> None:
    use_caches(sessions=cluster_cache(cluster))
    (info,) = check_deployment(None)  # nothing wrong: only what the sentinels answered
    assert info.id == "sentinel_cache.I001" and info.level == checks.INFO
    output = _check("--deploy", "--tag", "sentinel_cache")
    assert "WARNINGS" not in output and "ERRORS" not in output
    assert "sessions: (sentinel_cache.I001) 3 of 3 sentinels answered: " in output


def test_deploy_warns_quickly_about_unreachable_sentinels(
    cluster: LocalSentinelCluster, use_caches: UseCaches
) -> None:
    with BlackHoleServer() as hole:
        refused = f"127.0.0.1:{closed_port()}"
        sentinels = [hostport(a) for a in cluster.sentinel_addresses]
        sentinels += [hostport(hole.address), refused]
        use_caches(sessions=sentinel_cache(sentinels, cluster.master_names))
        started = time.monotonic()
        output = _check("--deploy", "--tag", "sentinel_cache")
        elapsed = time.monotonic() - started
    assert elapsed < 1.5, elapsed  # every sentinel asked at once, about every master
    assert "sessions: (sentinel_cache.W002) 2 of 5 sentinels unreachable" in output
    assert hostport(hole.address) in output and refused in output
    assert "W001" not in output
    assert "E00" not in output  # unreachable is a warning: the deploy machine may be elsewhere


def test_deploy_errors_on_a_master_no_sentinel_monitors(
    cluster: LocalSentinelCluster, use_caches: UseCaches
) -> None:
    entry = cluster_cache(cluster)
    entry["OPTIONS"]["MASTERS"] = [*cluster.master_names, "Shard1"]
    use_caches(sessions=entry)
    started = time.monotonic()
    messages = check_deployment(None)
    assert time.monotonic() - started < 1.5
    (error,) = _problems(messages)
    assert error.id == "sentinel_cache.E003" and error.level == checks.ERROR
    assert error.obj == "sessions"
    assert "master 'Shard1' is not monitored by any sentinel" in error.msg
    assert all(hostport(a) in error.msg for a in cluster.sentinel_addresses)
    assert "did you mean 'shard1'?" in error.msg
    assert "sentinel monitor" in (error.hint or "")
    with pytest.raises(SystemCheckError, match=r"sessions: \(sentinel_cache.E003\)"):
        _check("--deploy", "--tag", "sentinel_cache")


@pytest.mark.failover
def test_deploy_errors_on_a_refused_sentinel_password(
    make_cluster: ClusterFactory, use_caches: UseCaches
) -> None:
    cluster = make_cluster(shards=1, replicas=1, sentinels=1, sentinel_requirepass="right-pw")
    use_caches(sessions=cluster_cache(cluster, SENTINEL_PASSWORD="wrong-pw"))
    messages = check_deployment(None)
    ids = [m.id for m in messages]
    assert "sentinel_cache.E002" in ids
    assert "sentinel_cache.W002" not in ids  # refused is not unreachable
    assert "sentinel_cache.E003" not in ids  # nor "not monitored": it told us nothing
    (error,) = [m for m in messages if m.id == "sentinel_cache.E002"]
    assert error.level == checks.ERROR
    assert "authentication refused by 1 of 1 sentinels" in error.msg
    assert hostport(cluster.sentinel_addresses[0]) in error.msg
    assert "SENTINEL_PASSWORD" in (error.hint or "")
    assert "wrong-pw" not in error.msg and "right-pw" not in error.msg


def test_deploy_warns_about_a_sentinel_that_misses_a_master(
    cluster: LocalSentinelCluster, make_cluster: ClusterFactory, use_caches: UseCaches
) -> None:
    # A foreign sentinel that monitors its own "shard0" only: shard1 is unknown to it.
    other = make_cluster(shards=1, replicas=1, sentinels=1)
    stranger = hostport(other.sentinel_addresses[0])
    sentinels = [hostport(a) for a in cluster.sentinel_addresses] + [stranger]
    use_caches(sessions=sentinel_cache(sentinels, cluster.master_names))
    (warning,) = _problems(check_deployment(None))
    assert warning.id == "sentinel_cache.W003" and warning.level == checks.WARNING
    assert f"master 'shard1' is not monitored by {stranger}" in warning.msg


def test_deploy_skips_what_E001_reports(use_caches: UseCaches) -> None:
    use_caches(sessions=sentinel_cache(["127.0.0.1:26379"], MASTERS=[]))
    assert check_deployment(None) == []
    (error,) = check_configuration(None)
    assert error.id == "sentinel_cache.E001"
