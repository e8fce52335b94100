"""``python -m sentinel_cache.testing`` as a developer uses it: real subprocesses, real servers.

``up`` runs in the background with stable ports and a state file; ``status``, ``failover``,
``kill-master``, ``cli`` and ``down`` are separate invocations that find it through that file;
what ``up`` prints is pasted (Django settings, Flask settings, the URL) and must connect, with
the passwords. The server is ``$SENTINEL_CACHE_SERVER`` (the CLI picks it up like the suite).
About 15 s per server on 2 cores.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import socket
import stat
import subprocess
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from ports import free_port_base

from sentinel_cache.core.config import parse_cache_config
from sentinel_cache.core.ops.client import CacheClient
from sentinel_cache.core.serializers import Codec
from sentinel_cache.core.topology.sharded_pool import ShardedSentinelPool
from sentinel_cache.testing import find_server_binary

CLI = [sys.executable, "-m", "sentinel_cache.testing"]
NO_TOPOLOGY = "no topology found at {}; start one with `python -m sentinel_cache.testing up`"
TRANSITION = re.compile(r"^(\S+): (127\.0\.0\.1:\d+) -> (127\.0\.0\.1:\d+)")

pytestmark = pytest.mark.usefixtures("server_kind")  # skips when no server binary is found


def run(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=timeout)


def gone(pid: int) -> bool:
    """Dead, or a zombie waiting for a parent that is not us."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] == "Z"
    except OSError:
        return False


def cache_set_get(location: Any, options: dict[str, Any], key: str) -> None:
    """Connect with pasted settings the way both adapters do (their one parser) and round-trip."""
    config, _ = parse_cache_config(location, options)
    pool = ShardedSentinelPool.from_config(config)
    try:
        cache = CacheClient(pool, Codec())
        assert cache.set(key, {"pasted": key}, 30)
        assert cache.get(key) == {"pasted": key}
    finally:
        pool.close()


def parse_printed_settings(text: str) -> dict[str, Any]:
    """The Django block, the Flask block and the URL as a user would paste them."""
    django_src = text[text.index("CACHES = {") : text.index("# Flask config")]
    flask_src = text[text.index("# Flask config") : text.index("# Environment")]
    django: dict[str, Any] = {}
    exec(compile(django_src, "<django>", "exec"), {}, django)
    app = types.SimpleNamespace(config={})  # the docs' form: app.config.update(...)
    exec(compile(flask_src, "<flask>", "exec"), {"app": app})
    flask = app.config
    (env_line,) = [line for line in text.splitlines() if line.startswith("SENTINEL_CACHE_URL=")]
    (assignment,) = shlex.split(env_line)  # as a shell would read it
    return {"django": django["CACHES"], "flask": flask, "url": assignment.partition("=")[2]}


class Up:
    """``up`` running in the foreground of a background subprocess."""

    def __init__(self, state: Path, *args: str) -> None:
        self.state = state
        self.proc = subprocess.Popen(
            [*CLI, "up", "--state", str(state), *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        assert self.proc.stdout is not None
        lines = []
        for line in self.proc.stdout:  # settings, then "# state in ...": it is ready
            lines.append(line)
            if line.startswith("# state in "):
                break
        self.output = "".join(lines)

    @property
    def started(self) -> bool:
        return "# state in " in self.output

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
        self.proc.wait(timeout=30)
        if self.proc.stdout is not None:
            self.output += self.proc.stdout.read()
            self.proc.stdout.close()


@pytest.fixture
def topology(tmp_path: Path) -> Iterator[Up]:
    """2 shards (shard_a, shard_b) x 1 replica, 3 sentinels, stable ports, a data password."""
    for _ in range(3):  # another process may take a port between our probe and the start
        up = Up(
            tmp_path / "topology.json",
            *("--port-base", str(free_port_base(7)), "--masters", "shard_a,shard_b"),
            *("--password", "pw", "--down-after-ms", "500"),
        )
        if up.started:
            break
        up.stop()
        assert "is taken" in up.output, up.output
    else:
        pytest.fail(f"could not start a topology: {up.output}")
    try:
        yield up
    finally:
        up.stop()


def status(state: Path, *extra: str) -> dict[str, Any]:
    result = run("status", "--state", str(state), "--json", *extra)
    assert result.returncode == 0, result.stdout + result.stderr
    report: dict[str, Any] = json.loads(result.stdout)
    return report


def test_up_status_settings_failover_kill_cli_down(topology: Up) -> None:
    state = topology.state
    data = json.loads(state.read_text())
    assert stat.S_IMODE(state.stat().st_mode) == 0o600
    assert data["password_set"] is True and data["sentinel_password_set"] is False
    # No --print-secrets: flags only (a bare "pw" may occur by chance in a random temp path).
    dumped = json.dumps(data)
    assert '"pw"' not in dumped and ":pw@" not in dumped, dumped
    # The CLI picked the server the suite runs on ($SENTINEL_CACHE_SERVER).
    assert os.path.realpath(data["server"]["binary"]) == os.path.realpath(find_server_binary()[0])
    base = data["port_base"]
    ports = [p["port"] for p in data["processes"]]
    assert ports == list(range(base, base + 7))  # nodes first, shard by shard, then sentinels
    assert [p["role"] for p in data["processes"]] == ["node"] * 4 + ["sentinel"] * 3

    report = status(state)
    assert report["running"] is True
    assert set(report["masters"]) == {"shard_a", "shard_b"}
    assert report["masters"]["shard_a"]["master"] == f"127.0.0.1:{base}"
    assert report["masters"]["shard_b"]["master"] == f"127.0.0.1:{base + 2}"
    assert all(m["agree"] and len(m["replicas"]) == 1 for m in report["masters"].values())
    assert all(p["alive"] for p in report["processes"])
    text = run("status", "--state", str(state))
    assert text.returncode == 0 and f"shard_a: master 127.0.0.1:{base}" in text.stdout

    # What `up` printed works as pasted, password included.
    printed = parse_printed_settings(topology.output)
    django = printed["django"]["default"]
    assert django["OPTIONS"]["PASSWORD"] == "pw"
    cache_set_get(django["LOCATION"], django["OPTIONS"], "dev:django")
    assert printed["url"].startswith("sentinel://:pw@127.0.0.1:")
    cache_set_get(printed["url"], {}, "dev:url")
    flask = printed["flask"]
    assert flask["CACHE_REDIS_PASSWORD"] == "pw"
    import flask_caching
    from flask import Flask

    app = Flask("dev_topology")
    app.config.update(flask)
    cache = flask_caching.Cache(app)
    with app.app_context():
        assert cache.set("dev:flask", [1, 2])
        assert cache.get("dev:flask") == [1, 2]
        cache.cache.core.close()

    # A password the state file does not hold must be given (usage error, nothing done).
    refused = run("failover", "shard_a", "--state", str(state))
    assert refused.returncode == 2 and "--password" in refused.stderr
    unknown = run("failover", "no_such", "--state", str(state), "--password", "pw")
    assert unknown.returncode == 2 and "unknown master name 'no_such'" in unknown.stderr

    moved = run("failover", "shard_a", "--state", str(state), "--password", "pw")
    assert moved.returncode == 0, moved.stdout + moved.stderr
    name, old, new = TRANSITION.match(moved.stdout).groups()  # type: ignore[union-attr]
    assert (name, old) == ("shard_a", f"127.0.0.1:{base}") and new == f"127.0.0.1:{base + 1}"
    assert status(state)["masters"]["shard_a"]["master"] == new

    killed = run("kill-master", "shard_b", "--state", str(state), "--password", "pw")
    assert killed.returncode == 0, killed.stdout + killed.stderr
    name, old, new = TRANSITION.match(killed.stdout).groups()  # type: ignore[union-attr]
    assert (name, old, new) == ("shard_b", f"127.0.0.1:{base + 2}", f"127.0.0.1:{base + 3}")
    killed_pid = int(re.search(r"killed pid (\d+)", killed.stdout)[1])  # type: ignore[index]
    assert killed_pid == data["processes"][2]["pid"]
    after = status(state)
    assert after["masters"]["shard_b"]["master"] == new
    assert [p["alive"] for p in after["processes"]] == [True, True, False] + [True] * 4

    pong = run("cli", "--state", str(state), "--password", "pw", str(base), "PING")
    assert (pong.returncode, pong.stdout) == (0, "PONG\n")
    info = run(
        "cli", "--state", str(state), "--password", "pw", str(base + 1), "INFO", "replication"
    )
    assert info.returncode == 0 and "role:master" in info.stdout
    sentinel = run("cli", "--state", str(state), str(base + 4), "SENTINEL", "MASTERS")
    assert sentinel.returncode == 0 and "shard_a" in sentinel.stdout
    noauth = run("cli", "--state", str(state), str(base), "PING")
    assert noauth.returncode == 1 and "pass --password" in noauth.stdout

    pids = [p["pid"] for p in data["processes"]] + [data["pid"]]
    stopped = run("down", "--state", str(state))
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    assert topology.proc.wait(timeout=10) == 0
    assert all(gone(pid) for pid in pids)
    assert not state.exists()
    assert not os.path.exists(data["tmpdir"])


def test_detach_print_secrets_and_a_second_up(tmp_path: Path) -> None:
    state = tmp_path / "detached.json"
    started = run(
        *("up", "--detach", "--state", str(state), "--json", "--print-secrets"),
        *("--shards", "1", "--replicas", "0", "--sentinels", "1"),
        *("--port-base", str(free_port_base(2))),  # the default ones are test_dev_demo's
        *("--password", "node-pw", "--sentinel-password", "sentinel-pw"),
    )
    assert started.returncode == 0, started.stdout + started.stderr
    data = json.loads(state.read_text())
    try:
        printed = json.loads(started.stdout)  # the parent printed and left; the child runs
        assert printed["state"] == str(state) and not gone(data["pid"])
        assert data["password"] == "node-pw" and data["sentinel_password"] == "sentinel-pw"
        cache_set_get(printed["url"], {}, "dev:detached")
        node, sentinel = (p["port"] for p in data["processes"])
        # The state file holds the passwords: no --password needed, the right one per port.
        assert run("cli", "--state", str(state), str(node), "PING").stdout == "PONG\n"
        assert run("cli", "--state", str(state), str(sentinel), "PING").stdout == "PONG\n"
        assert status(state)["masters"]["shard0"]["master"] == f"127.0.0.1:{node}"
        again = run("up", "--state", str(state))
        assert again.returncode == 2 and "already running" in again.stderr
    finally:
        stopped = run("down", "--state", str(state))
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    assert all(gone(p["pid"]) for p in data["processes"]) and gone(data["pid"])
    assert not state.exists()


def test_error_paths(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    missing = tmp_path / "none.json"
    for command in (["status"], ["failover", "shard0"], ["kill-master", "shard0"], ["down"]):
        result = run(*command, "--state", str(missing))
        assert result.returncode == 2, (command, result.stderr)
        assert NO_TOPOLOGY.format(missing) in result.stderr
    # The environment variable names the state file too.
    monkeypatch.setenv("SENTINEL_CACHE_STATE", str(missing))
    result = run("status")
    assert result.returncode == 2 and NO_TOPOLOGY.format(missing) in result.stderr
    monkeypatch.delenv("SENTINEL_CACHE_STATE")

    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    result = run("status", "--state", str(broken))
    assert result.returncode == 2 and "not a sentinel_cache state file" in result.stderr

    base = free_port_base(5)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as squatter:
        squatter.bind(("127.0.0.1", base + 3))  # the second sentinel's port
        squatter.listen(1)
        result = run(
            *("up", "--state", str(tmp_path / "s.json"), "--port-base", str(base)),
            *("--shards", "1", "--replicas", "1", "--sentinels", "3"),
        )
    assert result.returncode == 1, result.stdout + result.stderr
    assert f"port {base + 3} on 127.0.0.1 is taken" in result.stderr
    assert not (tmp_path / "s.json").exists()

    bad = run("up", "--state", str(tmp_path / "s.json"), "--password", "two words")
    assert bad.returncode == 2 and "--password" in bad.stderr
    assert run("cli", "--state", str(missing), "1").returncode == 2  # no command
