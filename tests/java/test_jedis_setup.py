"""Where the Jedis jars come from, and that CI cannot pass without them (docs/java.md, "Which
Jedis is checked"): an explicit folder without the jars is an error; no folder is a skip saying
where they come from, allowed outside CI only; ``.ci/run`` stops before the suite without them.
Needs neither the jars nor a server."""

from __future__ import annotations

import subprocess
from pathlib import Path
from types import ModuleType

import jedis_support
import pytest
from jedis_support import JEDIS_DIR_ENV, ROOT, SKIP_SAYS, jedis_dir

NODEID = "tests/java/test_jedis.py::test_10000_keys_are_placed_alike_both_ways"


def _root_conftest(config: pytest.Config) -> ModuleType:
    path = ROOT / "tests" / "conftest.py"
    (found,) = [
        p
        for p in config.pluginmanager.get_plugins()
        if isinstance(p, ModuleType) and Path(getattr(p, "__file__", "") or "") == path
    ]
    return found


def test_an_explicit_folder_must_hold_the_jars(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(JEDIS_DIR_ENV, str(tmp_path))
    with pytest.raises(RuntimeError, match=f"{JEDIS_DIR_ENV}={tmp_path} lacks jedis-2.9.0.jar"):
        jedis_dir()


def test_no_folder_is_none(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(JEDIS_DIR_ENV, raising=False)
    monkeypatch.setattr(jedis_support, "DEFAULT_DIRS", (tmp_path / "a", tmp_path / "b"))
    assert jedis_dir() is None


def test_the_skip_is_allowed_outside_ci_only(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    allowed = _root_conftest(request.config)._allowed
    reason = f"Skipped: {SKIP_SAYS} (...); none found"
    monkeypatch.delenv("CI", raising=False)
    assert allowed(NODEID, reason, "redis") is not None
    monkeypatch.setenv("CI", "true")
    assert allowed(NODEID, reason, "redis") is None
    monkeypatch.delenv("CI")
    assert allowed(NODEID, "Skipped: something else", "redis") is None


def test_ci_run_stops_without_the_jars(tmp_path: Path) -> None:
    """The jar check of .ci/run, run alone with its fallback folders pointed at empty ones."""
    script = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    start, end = script.index('jedis_dir=""'), script.index('echo "jedis: ')
    check = script[start:end].replace("/work/shared/java", str(tmp_path / "none"))
    empty = tmp_path / "empty"
    empty.mkdir()
    ran = subprocess.run(
        ["bash", "-c", f"set -euo pipefail\n{check}\necho passed CI=$CI"],
        cwd=tmp_path,  # so ../shared/java is not the project's
        env={"PATH": "/usr/bin:/bin", JEDIS_DIR_ENV: str(empty)},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert ran.returncode == 1, ran.stdout + ran.stderr
    assert "CI: no Jedis jars" in ran.stderr and "passed" not in ran.stdout
