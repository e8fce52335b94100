"""Mistakes a newcomer makes, caught where they are made (issue 25): a MASTERS list that leaves
out a master the sentinels monitor (``check --deploy`` W006 and ``sentinel_status``), a
misspelled key of the CACHES entry, a string MASTERS, and the words of the status line."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.core.cache import caches
from django.core.exceptions import ImproperlyConfigured
from ops_support import UseCaches, cluster_cache, sentinel_cache, status

from sentinel_cache.django.checks import check_configuration, check_deployment
from sentinel_cache.testing import LocalSentinelCluster


def test_deploy_warns_about_a_master_masters_leaves_out(
    cluster: LocalSentinelCluster, use_caches: UseCaches
) -> None:
    entry = cluster_cache(cluster)
    first, second = cluster.master_names
    entry["OPTIONS"]["MASTERS"] = [first]
    use_caches(sessions=entry)
    (warning,) = [m for m in check_deployment(None) if m.id != "sentinel_cache.I001"]
    assert warning.id == "sentinel_cache.W006" and warning.obj == "sessions"
    assert f"the sentinels also monitor {second!r}, which MASTERS does not list" in warning.msg
    assert repr(first) not in warning.msg


def test_status_warns_about_a_master_masters_leaves_out(
    cluster: LocalSentinelCluster, use_caches: UseCaches
) -> None:
    entry = cluster_cache(cluster)
    first, second = cluster.master_names
    entry["OPTIONS"]["MASTERS"] = [first]
    use_caches(default=entry)
    code, text = status()
    assert code == 0, text  # a warning: shared sentinels may monitor other applications' masters
    assert text.startswith("cache 'default': HEALTHY (exit 0): 1 shard, 3 sentinels, checked ")
    warnings = text[text.index("\nwarnings:\n") :]
    assert f"the sentinels also monitor {second!r}, which MASTERS does not list" in warnings
    code, out = status("--json")
    report: dict[str, Any] = json.loads(out)["default"]
    assert report["unlisted_masters"] == [second]
    assert len(report["warnings"]) == 1 and repr(second) in report["warnings"][0]
    # The whole list: no warning.
    use_caches(default=cluster_cache(cluster))
    code, text = status()
    assert code == 0 and "warnings:" not in text and ": 2 shards, 3 sentinels," in text


@pytest.mark.parametrize("key", ["OPTION", "options", "KEY_PREFIXE", "TIMEOUTS"])
def test_a_misspelled_key_of_the_entry_is_named_with_a_hint(
    key: str, use_caches: UseCaches
) -> None:
    entry = sentinel_cache(["127.0.0.1:26379"])
    entry[key] = entry.pop("OPTIONS") if key.upper().startswith("OPTION") else 5
    use_caches(sessions=entry)
    meant = {"OPTION": "OPTIONS", "OPTIONS": "OPTIONS", "KEY_PREFIXE": "KEY_PREFIX"}
    expected = f"CACHES: unknown key {key!r} in this cache's entry; did you mean "
    expected += repr(meant.get(key.upper(), "TIMEOUT")) + "?"
    (error,) = check_configuration(None)
    assert error.id == "sentinel_cache.E001" and error.msg == expected
    with pytest.raises(ImproperlyConfigured) as raised:
        caches["sessions"].get("k")
    assert str(raised.value) == expected  # not "OPTIONS: MASTERS is required"


def test_the_entry_keys_django_knows_are_accepted(use_caches: UseCaches) -> None:
    entry = sentinel_cache(["127.0.0.1:26379"])
    entry.update(TIMEOUT=5, KEY_PREFIX="p", VERSION=2)
    entry["KEY_FUNCTION"] = "sentinel_cache.django.plain_key"
    use_caches(sessions=entry)
    assert check_configuration(None) == []


def test_a_string_masters_is_refused_with_the_list_form(use_caches: UseCaches) -> None:
    entry = sentinel_cache(["127.0.0.1:26379"])
    entry["OPTIONS"]["MASTERS"] = "shard_a"
    use_caches(sessions=entry)
    (error,) = check_configuration(None)
    assert error.msg.startswith("MASTERS: must be a list of master names")
    assert '"MASTERS": ["shard_a"]' in error.msg and "(got 'shard_a')" in error.msg
