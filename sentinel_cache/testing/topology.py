"""The state file of ``python -m sentinel_cache.testing up`` and control of the topology it
describes from another process (``status``, ``failover``, ``kill-master``, ``down``, ``cli``).

The state file is JSON: the ``up`` process's pid, the server binary, the tmpdir, the master
names, every process (role, port, pid, shard) and whether passwords are set. The passwords
themselves are in it only when ``up`` was given ``--print-secrets``. It is written atomically,
readable by its owner only, and removed by ``up`` when it stops.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

from sentinel_cache.testing.processes import HOST, POLL_INTERVAL, Address, pid_alive
from sentinel_cache.testing.readiness import (
    ask_sentinels,
    control_client,
    parse_pairs,
    wait_for_master_change,
)

#: Environment variable naming the state file (default ``./.sentinel_cache_topology.json``).
STATE_ENV = "SENTINEL_CACHE_STATE"
DEFAULT_STATE = ".sentinel_cache_topology.json"
STATE_VERSION = 1
UP_COMMAND = "python -m sentinel_cache.testing up"


class StateError(Exception):
    """The state file is missing, unreadable or not ours (a usage problem: exit code 2)."""


class OperationError(Exception):
    """The topology did not do what was asked (exit code 1)."""


def state_path(given: str | os.PathLike[str] | None = None) -> Path:
    """``given``, else ``$SENTINEL_CACHE_STATE``, else ``./.sentinel_cache_topology.json``."""
    chosen = given or os.environ.get(STATE_ENV) or DEFAULT_STATE
    return Path(chosen).expanduser().absolute()


def write_state(path: Path, payload: dict[str, Any]) -> None:
    """Write atomically (a reader never sees half a file), readable by the owner only."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=str(path.parent))
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(payload, fh, indent=2)
            fh.write("\n")
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def remove_state(path: Path, pid: int) -> None:
    """Remove the state file if it still describes the topology of ``pid``."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return
    if isinstance(data, dict) and data.get("pid") == pid:
        with contextlib.suppress(OSError):
            path.unlink()


def _cmdline(pid: int) -> bytes | None:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None


def _exe(pid: int) -> str | None:
    try:
        return os.path.realpath(os.readlink(f"/proc/{pid}/exe"))
    except OSError:
        return None


@dataclass
class Topology:
    """A running (or stale) topology as its state file describes it."""

    path: Path
    data: dict[str, Any]
    password: str | None = None
    sentinel_password: str | None = None
    _clients: dict[int, redis.Redis] = field(default_factory=dict, repr=False)

    # ----------------------------------------------------------------- loading

    @classmethod
    def load(
        cls,
        path: Path,
        *,
        password: str | None = None,
        sentinel_password: str | None = None,
    ) -> Topology:
        """Read ``path``; explicit passwords win over the ones the file may hold."""
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise StateError(
                f"no topology found at {path}; start one with `{UP_COMMAND}`"
            ) from None
        except OSError as exc:
            raise StateError(f"cannot read the state file {path}: {exc}") from None
        try:
            data = json.loads(text)
            if not isinstance(data, dict) or data.get("version") != STATE_VERSION:
                raise ValueError(f"not a version {STATE_VERSION} state file")
            for key in ("pid", "masters", "processes"):
                if key not in data:
                    raise ValueError(f"no {key!r}")
        except ValueError as exc:
            raise StateError(f"{path} is not a sentinel_cache state file: {exc}") from None
        return cls(
            path,
            data,
            password if password is not None else data.get("password"),
            sentinel_password if sentinel_password is not None else data.get("sentinel_password"),
        )

    def close(self) -> None:
        for client in self._clients.values():
            with contextlib.suppress(Exception):
                client.close()
        self._clients.clear()

    # ----------------------------------------------------------------- what the file says

    @property
    def pid(self) -> int:
        return int(self.data["pid"])

    @property
    def masters(self) -> list[str]:
        return [str(m) for m in self.data["masters"]]

    @property
    def processes(self) -> list[dict[str, Any]]:
        return list(self.data["processes"])

    @property
    def sentinels(self) -> list[dict[str, Any]]:
        return [p for p in self.processes if p["role"] == "sentinel"]

    def process_at(self, port: int) -> dict[str, Any] | None:
        for proc in self.processes:
            if int(proc["port"]) == port:
                return proc
        return None

    def up_alive(self) -> bool:
        """Whether the ``up`` process still runs (and is ours, where /proc can tell)."""
        if not pid_alive(self.pid):
            return False
        cmdline = _cmdline(self.pid)
        return cmdline is None or b"sentinel_cache.testing" in cmdline

    def server_alive(self, proc: dict[str, Any]) -> bool:
        """Whether a server process of the topology still runs (the pid is still the binary's)."""
        pid = proc.get("pid")
        if not pid or not pid_alive(int(pid)):
            return False
        binary = self.data.get("server", {}).get("binary")
        exe = _exe(int(pid))
        return binary is None or exe is None or exe == os.path.realpath(binary)

    def require_passwords(self, *, node: bool, sentinel: bool = True) -> None:
        """Raise :class:`StateError` if a password is set but neither given nor in the file."""
        missing = []
        if sentinel and self.data.get("sentinel_password_set") and self.sentinel_password is None:
            missing.append("--sentinel-password")
        if node and self.data.get("password_set") and self.password is None:
            missing.append("--password")
        if missing:
            raise StateError(
                f"the topology has passwords the state file {self.path} does not hold (`up` "
                f"ran without --print-secrets): pass {' and '.join(missing)}"
            )

    # ----------------------------------------------------------------- talking to it

    def _client(self, proc: dict[str, Any]) -> redis.Redis:
        port = int(proc["port"])
        client = self._clients.get(port)
        if client is None:
            is_sentinel = proc["role"] == "sentinel"
            password = self.sentinel_password if is_sentinel else self.password
            client = control_client(HOST, port, password)
            self._clients[port] = client
        return client

    def _callers(self) -> list[Callable[..., Any]]:
        live = [p for p in self.sentinels if self.server_alive(p)]
        return [self._client(p).execute_command for p in live]

    def check_master(self, name: str) -> None:
        if name not in self.masters:
            raise StateError(f"unknown master name {name!r}; the topology has {self.masters}")

    def sentinel_answers(self, name: str) -> dict[str, Address | None]:
        """Each sentinel's answer for ``name`` (None: dead or not answering)."""
        answers: dict[str, Address | None] = {}
        for proc in self.sentinels:
            address = f"{HOST}:{proc['port']}"
            if not self.server_alive(proc):
                answers[address] = None
                continue
            answers[address] = ask_sentinels([self._client(proc).execute_command], name)[0]
        return answers

    def master_address(self, name: str) -> Address:
        """The master of ``name`` most live sentinels name now."""
        answers = [a for a in self.sentinel_answers(name).values() if a is not None]
        if not answers:
            raise OperationError(f"no live sentinel reported a master for {name!r}")
        return Counter(answers).most_common(1)[0][0]

    def replicas(self, name: str) -> list[dict[str, str]]:
        """``SENTINEL REPLICAS`` from the first live sentinel that answers."""
        for call in self._callers():
            try:
                reply = call("SENTINEL", "REPLICAS", name)
            except (redis.RedisError, OSError):
                continue
            replicas = []
            for item in reply:
                pairs = parse_pairs(item)
                replicas.append(
                    {
                        "address": f"{pairs.get('ip')}:{pairs.get('port')}",
                        "flags": pairs.get("flags", ""),
                        "link": pairs.get("master-link-status", ""),
                        "role": pairs.get("role-reported", ""),
                    }
                )
            return replicas
        return []

    def role(self, address: Address) -> str | None:
        proc = self.process_at(address[1])
        if proc is None:
            return None
        try:
            reply = self._client(proc).execute_command("ROLE")
        except (redis.RedisError, OSError):
            return None
        return str(reply[0]) if reply else None

    def wait_for_master_change(self, name: str, old: Address, timeout: float) -> Address:
        try:
            return wait_for_master_change(
                name, old, lambda: ask_sentinels(self._callers(), name), self.role, timeout
            )
        except TimeoutError as exc:
            raise OperationError(str(exc)) from None

    def failover(self, name: str, timeout: float) -> tuple[Address, Address]:
        """SENTINEL FAILOVER through a live sentinel; returns (old, new) once they agree."""
        old = self.master_address(name)
        errors = []
        for call in self._callers():
            try:
                call("SENTINEL", "FAILOVER", name)
                break
            except redis.ResponseError as exc:
                raise OperationError(f"SENTINEL FAILOVER {name}: {exc}") from None
            except (redis.RedisError, OSError) as exc:
                errors.append(str(exc))
        else:
            raise OperationError(f"no live sentinel accepted SENTINEL FAILOVER {name}: {errors}")
        return old, self.wait_for_master_change(name, old, timeout)

    def kill_master(self, name: str, timeout: float) -> tuple[Address, Address, int]:
        """SIGKILL the current master of ``name``; returns (old, new, pid) after the failover."""
        old = self.master_address(name)
        proc = self.process_at(old[1])
        if proc is None or proc["role"] != "node":
            raise OperationError(f"the master of {name!r}, {old}, is not a node of this topology")
        pid = int(proc["pid"])
        if not self.server_alive(proc):
            raise OperationError(f"the master of {name!r}, {old} (pid {pid}), is not running")
        replicas = self.replicas(name)
        if not any(_promotable(r) for r in replicas):
            seen = ", ".join(f"{r['address']} ({r['flags']}, link {r['link']})" for r in replicas)
            raise OperationError(
                f"no replica of {name!r} is linked to its master now (the sentinels see: "
                f"{seen or 'none'}), so nothing was killed; a former master takes ~10 s to "
                "rejoin as a replica after a failover"
            )
        try:  # the pid answering on the port must be the one in the file
            info = self._client(proc).execute_command("INFO", "server")
            answering = int(dict(info).get("process_id", 0))
        except (redis.RedisError, OSError):
            answering = pid  # not answering (frozen?): the pid and binary checks above hold
        if answering != pid:
            raise OperationError(f"{HOST}:{old[1]} is answered by pid {answering}, not {pid}")
        os.kill(pid, signal.SIGKILL)
        self._drop(old[1])
        return old, self.wait_for_master_change(name, old, timeout), pid

    def _drop(self, port: int) -> None:
        client = self._clients.pop(port, None)
        if client is not None:
            with contextlib.suppress(Exception):
                client.close()

    def status(self) -> dict[str, Any]:
        """Everything ``status`` prints, as a JSON-able dict."""
        masters: dict[str, Any] = {}
        for name in self.masters:
            answers = self.sentinel_answers(name)
            named = [a for a in answers.values() if a is not None]
            master = Counter(named).most_common(1)[0][0] if named else None
            masters[name] = {
                "master": f"{master[0]}:{master[1]}" if master else None,
                "agree": bool(named) and len(set(named)) == 1,
                "sentinels": {k: (f"{v[0]}:{v[1]}" if v else None) for k, v in answers.items()},
                "replicas": self.replicas(name),
            }
        processes = [
            {
                "role": p["role"],
                "address": f"{HOST}:{p['port']}",
                "port": int(p["port"]),
                "pid": p.get("pid"),
                "shard": p.get("shard"),
                "alive": self.server_alive(p),
            }
            for p in self.processes
        ]
        return {
            "state": str(self.path),
            "pid": self.pid,
            "running": self.up_alive(),
            "server": self.data.get("server", {}),
            "tmpdir": self.data.get("tmpdir"),
            "masters": masters,
            "processes": processes,
        }

    # ----------------------------------------------------------------- stopping

    def down(self, timeout: float) -> str:
        """Stop the topology: SIGTERM the ``up`` process and wait until it and its servers are
        gone. A stale file (``up`` died without cleaning up) is cleaned up here instead."""
        self.close()
        servers = [p for p in self.processes if p.get("pid")]
        if self.up_alive():
            os.kill(self.pid, signal.SIGTERM)
            deadline = time.monotonic() + timeout
            while self.up_alive() or any(self.server_alive(p) for p in servers):
                if time.monotonic() > deadline:
                    raise OperationError(
                        f"the topology (up pid {self.pid}) is still running after {timeout}s"
                    )
                time.sleep(POLL_INTERVAL)
            remove_state(self.path, self.pid)  # normally `up` already did
            return f"stopped the topology of pid {self.pid}"
        leftovers = [p for p in servers if self.server_alive(p)]
        _terminate_pids([int(p["pid"]) for p in leftovers], grace=3.0)
        tmpdir = self.data.get("tmpdir")
        if tmpdir and os.path.basename(str(tmpdir)).startswith("sentinel-cache-"):
            shutil.rmtree(tmpdir, ignore_errors=True)
        remove_state(self.path, self.pid)
        return (
            f"the up process (pid {self.pid}) was already gone; stopped {len(leftovers)} "
            f"leftover server(s) and removed {self.path}"
        )


def _promotable(replica: dict[str, str]) -> bool:
    """A replica the sentinels would promote: healthy, linked, and itself saying so."""
    return (
        replica["flags"] == "slave"
        and replica["link"] == "ok"
        and replica.get("role", "slave") in ("slave", "")
    )


def _terminate_pids(pids: Sequence[int], grace: float) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while any(pid_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(POLL_INTERVAL)
    for pid in pids:
        if pid_alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
