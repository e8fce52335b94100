"""``manage.py sentinel_reshard``: the dry run, the migration, progress, JSON and exit codes; and
a logged-in Django session through an append (``SESSION_ENGINE`` on our cache)."""

from __future__ import annotations

import io
import json
import logging
from typing import Any

import pytest
from django.contrib.sessions.backends.cache import SessionStore
from django.core.cache import caches
from django.core.management import call_command
from django.core.management.base import CommandError
from durable_support import shortfalls
from reshard_support import (
    AFTER,
    BEFORE,
    KEYS,
    django_entry,
    flush,
    holders,
    locations,
    moving,
    owner,
    place,
)
from threads import Workers

from sentinel_cache.testing import LocalSentinelCluster


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def _run(*args: str, stderr: io.StringIO | None = None) -> tuple[int, str, str]:
    """Run the command; returns (exit code, stdout, stderr)."""
    out, err = io.StringIO(), stderr if stderr is not None else io.StringIO()
    try:
        call_command("sentinel_reshard", *args, stdout=out, stderr=err)
    except SystemExit as exc:
        return int(exc.code or 0), out.getvalue(), err.getvalue()
    return 0, out.getvalue(), err.getvalue()


def _deployed(topology: LocalSentinelCluster, use_caches: Any, **more: Any) -> None:
    """The new placement deployed with the previous one beside it."""
    use_caches(sessions=django_entry(topology, AFTER, PREVIOUS_MASTERS=BEFORE), **more)


def test_dry_run_counts_and_moves_nothing(topology: LocalSentinelCluster, use_caches: Any) -> None:
    place(topology)
    _deployed(topology, use_caches)
    expected = moving()
    code, out, err = _run("--dry-run", "--json")
    assert code == 0, out + err
    plan = json.loads(out)["sessions"]
    assert plan["dry_run"] is True and plan["scanned"] == len(KEYS)
    assert {(f["from"], f["to"]): f["keys"] for f in plan["flows"]} == expected
    assert plan["warnings"] == [] and err == ""
    assert locations(topology) == {k: [owner(k, BEFORE)] for k in KEYS}  # nothing moved

    code, out, _ = _run("--dry-run", "--sample", "100")
    assert code == 0
    assert "Dry run: PREVIOUS_MASTERS [shard0, shard1] -> MASTERS [shard0, shard1, shard2]" in out
    assert "a sample of up to 100 keys a shard" in out and "shard0 -> shard2" in out


def test_dry_run_warns_about_a_master_removed_in_the_middle(
    topology: LocalSentinelCluster, use_caches: Any
) -> None:
    place(topology, AFTER)
    use_caches(sessions=django_entry(topology, ["shard0", "shard2"], PREVIOUS_MASTERS=AFTER))
    code, out, _ = _run("--dry-run")
    assert code == 0
    assert "shard1 is removed from the middle of the list" in out
    assert "master shard2 moves from position 2 to 1" in out


def test_migration_with_json_and_again(topology: LocalSentinelCluster, use_caches: Any) -> None:
    place(topology)
    _deployed(topology, use_caches)
    code, out, err = _run("--json", "--batch", "300")
    assert code == 0, out + err
    assert err == ""  # no progress with --json
    report = json.loads(out)["sessions"]
    assert report["complete"] is True and report["errors"] == []
    assert {(p["from"], p["to"]): p["moved"] for p in report["pairs"]} == moving()
    assert [s["name"] for s in report["shards"]] == BEFORE
    assert locations(topology) == {k: [owner(k, AFTER)] for k in KEYS}
    code, out, _ = _run("--json")
    assert code == 0 and json.loads(out)["sessions"]["moved"] == 0


def test_progress_lines_and_text_report(topology: LocalSentinelCluster, use_caches: Any) -> None:
    place(topology)
    _deployed(topology, use_caches)
    code, out, err = _run("--rate", "100000", "--match", "cmd:1*")
    assert code == 0, out + err
    assert out.startswith("cache 'sessions'\nMigration done in ")
    assert "matching 'cmd:1*'" in out and "shard0 -> shard2" in out
    lines = err.splitlines()
    assert lines[0] == "cache 'sessions': migrating"
    assert lines[-1].startswith("shard 2/2 shard1: scanned") and lines[-1].endswith("(done)")
    assert "\r" not in err  # not a terminal: plain lines
    changing = [k for k in KEYS if owner(k, BEFORE) != owner(k, AFTER)]
    matched = next(k for k in changing if k.startswith("cmd:1"))
    other = next(k for k in changing if not k.startswith("cmd:1"))
    assert holders(topology, matched) == [owner(matched, AFTER)]
    assert holders(topology, other) == [owner(other, BEFORE)]  # not matched: not moved


def test_progress_bar_on_a_terminal(topology: LocalSentinelCluster, use_caches: Any) -> None:
    place(topology)
    _deployed(topology, use_caches)
    code, _, err = _run(stderr=_Terminal())
    assert code == 0
    assert "\r[" in err and "keys/s" in err and err.endswith("\n")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--cache", "nope"), "unknown cache alias 'nope'"),
        (("--cache", "plain"), "cache 'plain' has no PREVIOUS_MASTERS"),
        (("--rate", "0"), "--rate must be a positive number"),
        (("--sample", "10"), "--sample needs --dry-run"),
        (("--batch", "lots"), "invalid int value"),
    ],
)
def test_usage_and_configuration_errors_exit_3(
    topology: LocalSentinelCluster, use_caches: Any, args: tuple[str, ...], message: str
) -> None:
    use_caches(
        sessions=django_entry(topology, AFTER, PREVIOUS_MASTERS=BEFORE),
        plain=django_entry(topology, BEFORE),
    )
    with pytest.raises(CommandError, match=message) as caught:
        _run(*args)
    assert caught.value.returncode == 3


def test_no_cache_with_previous_masters_exits_3(
    topology: LocalSentinelCluster, use_caches: Any
) -> None:
    use_caches(plain=django_entry(topology, BEFORE))
    with pytest.raises(CommandError, match="PREVIOUS_MASTERS") as caught:
        _run()
    assert caught.value.returncode == 3


def test_a_shard_given_up_exits_1(topology: LocalSentinelCluster, use_caches: Any) -> None:
    place(topology)
    use_caches(
        sessions=django_entry(topology, BEFORE, PREVIOUS_MASTERS=[*BEFORE, "ghost"]),
    )
    code, out, err = _run("--json", "--retry-for", "0.2")
    assert code == 1, out + err
    report = json.loads(out)["sessions"]
    assert report["complete"] is False
    assert [s["name"] for s in report["shards"] if not s["complete"]] == ["ghost"]
    code, out, _ = _run("--retry-for", "0.2")
    assert code == 1 and "INCOMPLETE" in out and "ghost" in out


# -- a logged-in session through an append ------------------------------------------------------


def test_a_logged_in_session_stays_logged_in_through_an_append(
    topology: LocalSentinelCluster, use_caches: Any
) -> None:
    flush(topology)
    sessions = {"SESSION_ENGINE": "django.contrib.sessions.backends.cache"}
    sessions["SESSION_CACHE_ALIAS"] = "sessions"
    use_caches(sessions, sessions=django_entry(topology, BEFORE, KEY_PREFIX="site"))
    users: dict[str, str] = {}
    for n in range(60):
        store = SessionStore()
        store["_auth_user_id"] = str(n)
        store["_auth_user_backend"] = "django.contrib.auth.backends.ModelBackend"
        store.create()
        users[str(store.session_key)] = str(n)
    filler = {f"page:{n}": "x" * 200 for n in range(3000)}
    caches["sessions"].set_many(filler, 600)

    # The new deployment: shard2 appended, the previous placement beside it.
    use_caches(
        sessions,
        sessions=django_entry(topology, AFTER, PREVIOUS_MASTERS=BEFORE, KEY_PREFIX="site"),
    )
    cache = caches["sessions"]
    stored = {key: cache.make_key(SessionStore.cache_key_prefix + key) for key in users}
    moved = [key for key in users if cache.core.previous_shard_for(stored[key]) is not None]
    assert len(moved) >= 5, "some sessions live on a shard that changes"

    # Half the users come back during the migration (their reads move their sessions too);
    # the others only after it, with PREVIOUS_MASTERS gone: the migration moved theirs.
    watched = dict(list(users.items())[::2])
    untouched = {key: user for key, user in users.items() if key not in watched}
    assert len([key for key in moved if key in untouched]) >= 2

    def logged_out(which: dict[str, str]) -> list[str]:
        """The sessions that lost their user (none may)."""
        return [
            key for key, user in which.items() if SessionStore(key).get("_auth_user_id") != user
        ]

    result: list[Any] = []
    rounds = 0
    with Workers(timeout=120) as workers:
        migration = workers.spawn(lambda: result.append(_run("--rate", "3000")), name="migrate")
        while migration.is_alive():
            assert logged_out(watched) == []
            rounds += 1
    assert result[0][0] == 0, result
    assert rounds >= 3, "sessions were read during the migration"
    assert logged_out(watched) == []
    for key in moved:  # now only on its new owner
        assert holders(topology, stored[key]) == [cache.core.shard_for(stored[key]).name]
    # Deployed without PREVIOUS_MASTERS afterwards: everyone still logged in.
    use_caches(sessions, sessions=django_entry(topology, AFTER, KEY_PREFIX="site"))
    assert logged_out(users) == []
    assert caches["sessions"].get_many(list(filler)) == filler


def test_the_strongest_durable_replicas_of_the_caches_on_the_core_applies(
    topology: LocalSentinelCluster,
    use_caches: Any,
    caplog: pytest.LogCaptureFixture,
    every_log_line: None,
) -> None:
    """Aliases with equal settings share one core, and the migration moves all their keys: the
    most DURABLE_REPLICAS among them applies, even with ``--cache`` naming another. (This
    topology has no replicas: every WAIT falls short, and is logged.)"""
    place(topology)
    durable = django_entry(
        topology,
        AFTER,
        PREVIOUS_MASTERS=BEFORE,
        KEY_PREFIX="durable",
        DURABLE_REPLICAS=1,
        DURABLE_TIMEOUT_MS=20,
    )
    _deployed(topology, use_caches, durable=durable)
    assert caches["sessions"].core is caches["durable"].core
    caplog.set_level(logging.WARNING, logger="sentinel_cache")
    code, out, err = _run("--cache", "sessions")
    assert code == 0, out + err
    # the owner's restores and the sources' deletes
    assert set(shortfalls(caplog, 20)) == {
        f"write to shard {name} acknowledged by 0 of 1 replicas within 20 ms" for name in AFTER
    }
    assert locations(topology) == {k: [owner(k, AFTER)] for k in KEYS}
