"""``sentinel_reshard --from-previous-cache`` on a live site (issue 35): a key deleted on this
cache while the migration's batch copies it is done, not a reason to run again. The delete
removed the old copy before it left its tombstone, so the copy refused by that tombstone has
nothing left to move: the run completes (exit 0), counts the key as gone, and the delete
stays. Before, every such key made the run incomplete (exit 1, "run again") though a second
run found nothing, so a migration under traffic ended with an error on most runs (2 keys in
1 of 3 runs of tests/history/test_history_previous.py)."""

from __future__ import annotations

import io
import json
import uuid
from collections.abc import Iterator
from typing import Any
from unittest import mock

import pytest
import redis
from minimal_django import configure_django

configure_django()

from adoption_support import ours, site  # noqa: E402
from django.core.cache import caches  # noqa: E402
from django.core.management import call_command  # noqa: E402

from sentinel_cache.core.admin.reshard.previous import Adopter  # noqa: E402
from sentinel_cache.management.commands.sentinel_reshard import Command as Reshard  # noqa: E402
from sentinel_cache.testing import LocalSentinelCluster  # noqa: E402


@pytest.fixture(scope="module")
def old(server_kind: str) -> Iterator[tuple[str, int]]:
    """The server the site ran on before: one plain node (its sentinel unused)."""
    with LocalSentinelCluster(shards=1, replicas=0, sentinels=1) as topology:
        yield topology.master_address(topology.master_names[0])


def _migrate() -> tuple[int, dict[str, Any]]:
    """The command's exit code (0, or the SystemExit's) and its JSON report."""
    out = io.StringIO()
    try:
        call_command(Reshard(), "--from-previous-cache", "--json", stdout=out, stderr=io.StringIO())
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    return code, dict(json.loads(out.getvalue()))["default"]


@pytest.mark.parametrize("how", ["delete", "delete_many"])
def test_a_key_deleted_while_its_batch_copies_it_completes_the_run(
    how: str, cluster: LocalSentinelCluster, old: tuple[str, int]
) -> None:
    prefix = f"m{uuid.uuid4().hex[:8]}"
    entry = {
        "BACKEND": "django_redis.cache.RedisCache",
        "LOCATION": f"redis://{old[0]}:{old[1]}/0",
        "KEY_PREFIX": prefix,
    }
    with site(ours(cluster, KEY_PREFIX=prefix), entry):
        cache, previous = caches["default"], caches["old"]
        keys = {f"k{i}": i for i in range(20)}
        previous.set_many(keys, timeout=600)
        victim: list[str] = []
        written = Adopter._written

        def racing(self: Adopter, shard: Any, commands: Any) -> Any:
            """Before the batch's first copies: one of its keys deleted through the site
            (the old copy removed, a tombstone left on its shard, ours deleted)."""
            if not victim:
                made = {cache.make_key(k): k for k in keys}
                key = next(k for m, k in made.items() if self.client.core.shard_for(m) is shard)
                victim.append(key)
                if how == "delete":
                    assert cache.delete(key) is False  # not on ours yet: only the old copy
                else:
                    cache.delete_many([key])
            return written(self, shard, commands)

        with mock.patch.object(Adopter, "_written", racing):
            code, report = _migrate()
        (key,) = victim
        server = redis.Redis(*old)
        try:
            left = server.keys(f"{prefix}:*")
        finally:
            server.close()
        assert (code, report["complete"], report["shards"][0]["error"]) == (0, True, None), report
        assert report["moved"] == 19 and report["expired"] == 1, report
        assert cache.get(key) is None and left == []
        assert cache.get_many(list(keys)) == {k: v for k, v in keys.items() if k != key}
