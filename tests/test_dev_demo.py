"""``python -m sentinel_cache.testing demo`` and ``up``'s default ports, as a newcomer runs them
(issue 25): real subprocesses and servers, from a directory outside the checkout."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from ports import free_port_base

from sentinel_cache.testing.__main__ import DEFAULT_PORT_BASE, PORT_BASE_ENV

ROOT = Path(__file__).resolve().parent.parent
CLI = [sys.executable, "-m", "sentinel_cache.testing"]

pytestmark = pytest.mark.usefixtures("server_kind")  # skips when no server binary is found


def run(
    cwd: Path, *args: str, timeout: float = 120, port_base: int | None = None
) -> subprocess.CompletedProcess[str]:
    """The command in ``cwd``; ``port_base``: its default base (``$SENTINEL_CACHE_PORT_BASE``),
    so a test owns the ports it checks instead of 6390 and up, which anyone may hold."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop(PORT_BASE_ENV, None)
    if port_base is not None:
        env[PORT_BASE_ENV] = str(port_base)
    return subprocess.run(
        [*CLI, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )


def test_demo_fails_a_shard_over_under_load_with_nothing_failed_or_lost(tmp_path: Path) -> None:
    result = run(tmp_path, "demo")
    out = result.stdout
    assert result.returncode == 0, out + result.stderr
    assert "set_many and get_many of 1000 keys: every value read back" in out
    (moved,) = re.findall(
        r"shard0: (127\.0\.0\.1:\d+) -> (127\.0\.0\.1:\d+); the cache followed", out
    )
    assert moved[0] != moved[1]
    (calls, acknowledged) = map(
        int,
        re.search(r"(\d+) calls \((\d+) writes acknowledged\)", out).groups(),  # type: ignore[union-attr]
    )
    assert calls >= 600 and acknowledged >= 300  # the loop ran through the failover
    assert ", 0 failed, 0 acknowledged writes lost" in out
    assert out.rstrip().endswith("stopped every server and sentinel")
    assert list(tmp_path.iterdir()) == []  # no state file, nothing left behind


def _ports(state: Path) -> list[int]:
    return [p["port"] for p in json.loads(state.read_text())["processes"]]


def _up_and_down(cwd: Path, *args: str, port_base: int | None = None) -> tuple[str, list[int]]:
    state = cwd / "topology.json"
    started = run(cwd, "up", "--detach", "--state", str(state), *args, port_base=port_base)
    assert started.returncode == 0, started.stdout + started.stderr
    try:
        ports = _ports(state)
    finally:
        stopped = run(cwd, "down", "--state", str(state))
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    return started.stdout, ports


SMALL = ("--shards", "1", "--replicas", "0", "--sentinels", "1")


def test_up_keeps_its_ports_across_runs(tmp_path: Path) -> None:
    """Without ``--port-base``, two runs take the same ports: the default base's. The test owns
    that base (free ports it picked, given as ``$SENTINEL_CACHE_PORT_BASE``), so a developer's
    own ``up`` on 6390 and up cannot fail it; the 6390 default itself is checked below."""
    base = free_port_base(2)
    first_out, first = _up_and_down(tmp_path, *SMALL, port_base=base)
    second_out, second = _up_and_down(tmp_path, *SMALL, port_base=base)
    # Free a moment ago; taken since by another process, the run says so and proves nothing.
    busy = [out for out in (first_out, second_out) if "random free ports instead" in out]
    assert not busy, f"ports from {base} were taken by another process meanwhile: {busy}"
    assert first == second == [base, base + 1]
    assert f"127.0.0.1:{second[-1]}" in second_out  # the settings printed name the sentinel


def test_the_default_base_is_6390_unless_the_environment_moves_it() -> None:
    """What ``up`` starts on without ``--port-base`` or the variable, without starting it."""
    env = {k: v for k, v in os.environ.items() if k != PORT_BASE_ENV}
    code = "from sentinel_cache.testing.__main__ import default_port_base as d; print(d())"
    ask = [sys.executable, "-c", code]
    plain = subprocess.run(ask, env=env, capture_output=True, text=True, cwd=ROOT, check=True)
    assert int(plain.stdout) == DEFAULT_PORT_BASE == 6390
    moved = {**env, PORT_BASE_ENV: "23456"}
    assert subprocess.run(ask, env=moved, capture_output=True, text=True, cwd=ROOT).stdout == (
        "23456\n"
    )


def test_up_refuses_a_port_base_variable_that_is_no_port(tmp_path: Path) -> None:
    env_bad = run(tmp_path, "up", "--state", str(tmp_path / "s.json"), *SMALL, port_base=0)
    assert env_bad.returncode == 2, env_bad.stdout + env_bad.stderr
    assert f"{PORT_BASE_ENV} must be a port number, 1 to 65535 (got '0')" in env_bad.stderr


def test_up_takes_free_ports_when_the_default_ones_are_busy(tmp_path: Path) -> None:
    base = free_port_base(2)
    with socket.socket() as squatter:
        squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        squatter.bind(("127.0.0.1", base))
        squatter.listen(1)
        out, ports = _up_and_down(tmp_path, *SMALL, port_base=base)
    assert f"port {base} on 127.0.0.1 is taken" in out
    assert "random free ports instead (--port-base N chooses)" in out
    assert base not in ports
    # A base the user chose is never replaced: its clash is an error.
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen(1)
        base = squatter.getsockname()[1]
        chosen = run(
            tmp_path, "up", "--state", str(tmp_path / "s.json"), "--port-base", str(base), *SMALL
        )
    assert chosen.returncode == 1 and f"port {base} on 127.0.0.1 is taken" in chosen.stderr


def test_help_shows_the_port_base_default_and_detach(tmp_path: Path) -> None:
    text = run(tmp_path, "up", "--help").stdout
    assert f"(default {DEFAULT_PORT_BASE}," in " ".join(text.split())
    assert "--detach" in text
    assert "demo" in run(tmp_path, "--help").stdout
