"""What ``flask sentinel-status`` gained from the shared command table (issue 23): ``--cache``
(a cache chosen by its key prefix) and ``--watch`` (the same refresh loop as
``manage.py sentinel_status --watch``), on the session topology."""

from __future__ import annotations

import json

import pytest
from flask_caching import Cache
from flask_support import MakeApp, opened, settings_for

from sentinel_cache.core.admin.commands import CLEAR_SCREEN
from sentinel_cache.testing import LocalSentinelCluster


def test_watch_json_streams_one_compact_report_per_refresh(make_app: MakeApp) -> None:
    app, _, _ = make_app()
    result = app.test_cli_runner().invoke(
        args=["sentinel-status", "--json", "--watch", "0.05", "--iterations", "2"]
    )
    assert result.exit_code == 0, result.output
    assert CLEAR_SCREEN not in result.output
    lines = result.output.splitlines()
    assert len(lines) == 2
    assert [json.loads(line)["state"] for line in lines] == ["healthy", "healthy"]


def test_watch_text_clears_the_screen_and_says_how_to_stop(make_app: MakeApp) -> None:
    app, _, _ = make_app()
    result = app.test_cli_runner().invoke(
        args=["sentinel-status", "--watch", "0.05", "--iterations", "2"], color=True
    )
    assert result.exit_code == 0, result.output
    assert result.output.count(CLEAR_SCREEN) == 2
    assert result.output.count("HEALTHY (exit 0)") == 2
    assert "refreshing every 0.05s; Ctrl-C to stop (exit code 0)" in result.output


def test_ctrl_c_ends_watch_with_the_last_code(
    make_app: MakeApp, monkeypatch: pytest.MonkeyPatch
) -> None:
    def interrupt(seconds: float) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr("time.sleep", interrupt)
    app, _, _ = make_app()
    # --iterations bounds the loop should Ctrl-C not end it (the test then fails, not hangs).
    result = app.test_cli_runner().invoke(args=["sentinel-status", "--watch", "--iterations", "3"])
    assert result.exit_code == 0, result.output
    assert result.output.count("HEALTHY") == 1
    assert "refreshing every 2s" in result.output


def test_cache_chooses_one_cache_by_its_key_prefix(
    cluster: LocalSentinelCluster, make_app: MakeApp
) -> None:
    app, _, _ = make_app(CACHE_KEY_PREFIX="a:")
    other = Cache(
        app, config={**settings_for(cluster), "CACHE_KEY_PREFIX": "b:", "CACHE_REDIS_DB": 10}
    )
    pool = app.extensions["cache"][other].core
    opened[id(pool)] = pool
    runner = app.test_cli_runner()
    both = runner.invoke(args=["sentinel-status", "--json"])
    assert both.exit_code == 0, both.output
    assert isinstance(json.loads(both.output), list)  # two cores: a list of reports
    chosen = runner.invoke(args=["sentinel-status", "--json", "--cache", "b:"])
    assert chosen.exit_code == 0, chosen.output
    assert json.loads(chosen.output)["state"] == "healthy"  # one cache: its report alone
    missing = runner.invoke(args=["sentinel-status", "--cache", "c:"])
    assert missing.exit_code == 3
    assert "no cache of type" in missing.stderr and "'c:'" in missing.stderr
    assert "'a:', 'b:'" in missing.stderr  # the prefixes there are
