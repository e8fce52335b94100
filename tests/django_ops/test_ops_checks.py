"""System checks: configuration errors without connecting, and ``check --deploy`` warnings."""

from __future__ import annotations

import time
from io import StringIO
from typing import Any

import pytest
from django.core import checks
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from ops_support import UseCaches, closed_port, cluster_cache, hostport, sentinel_cache

from sentinel_cache.django.checks import check_configuration, check_deployment
from sentinel_cache.testing import BlackHoleServer, LocalSentinelCluster


def _check(*args: str) -> str:
    """``manage.py check ARGS``; returns what it printed (warnings go to stderr)."""
    out, err = StringIO(), StringIO()
    call_command("check", *args, stdout=out, stderr=err)
    return out.getvalue() + err.getvalue()


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
    assert check_deployment(None) == []
    assert "no issues" in _check("--deploy", "--tag", "sentinel_cache")


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
    assert elapsed < 2.0, elapsed
    assert "sessions: (sentinel_cache.W002) 2 of 5 sentinels unreachable" in output
    assert hostport(hole.address) in output and refused in output
    assert "W001" not in output


def test_deploy_skips_what_E001_reports(use_caches: UseCaches) -> None:
    use_caches(sessions=sentinel_cache(["127.0.0.1:26379"], MASTERS=[]))
    assert check_deployment(None) == []
    (error,) = check_configuration(None)
    assert error.id == "sentinel_cache.E001"
