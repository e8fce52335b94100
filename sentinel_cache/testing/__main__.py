"""``python -m sentinel_cache.testing``: a local Sentinel topology to develop against.

``demo`` shows the library at work and stops (:mod:`~sentinel_cache.testing.demo`). ``up``
starts a topology, prints the settings to paste into a Django or Flask project (or, with
``--json``, one JSON line for scripts), writes a state file and runs until Ctrl-C/SIGTERM (or,
with ``--detach``, in the background). From another terminal, the state file is the handle:
``status``, ``failover NAME``, ``kill-master NAME``, ``cli PORT COMMAND...`` and ``down``.

Exit codes: 0 ok, 1 the operation failed (start-up, a failover that did not complete in time...),
2 usage or state-file problems.
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from types import FrameType
from typing import Any

import redis

from sentinel_cache.testing import demo
from sentinel_cache.testing.cluster import LocalSentinelCluster
from sentinel_cache.testing.pasted import settings_json, settings_text
from sentinel_cache.testing.processes import HOST, PortTakenError
from sentinel_cache.testing.topology import (
    DEFAULT_STATE,
    STATE_ENV,
    STATE_VERSION,
    OperationError,
    StateError,
    Topology,
    remove_state,
    state_path,
    write_state,
)

PROG = "python -m sentinel_cache.testing"
#: ``up``'s ports when none are chosen: the same every run, so the settings pasted stay valid.
DEFAULT_PORT_BASE = 6390
# The topology's own defaults, read from it so the help cannot drift from what `up` starts.
_TOPOLOGY_DEFAULTS = inspect.signature(LocalSentinelCluster.__init__).parameters
DEFAULT_DOWN_AFTER_MS: int = _TOPOLOGY_DEFAULTS["down_after_ms"].default
DEFAULT_FAILOVER_TIMEOUT_MS: int = _TOPOLOGY_DEFAULTS["failover_timeout_ms"].default
_USAGE, _FAILED = 2, 1


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Run a local Redis/Valkey Sentinel topology on 127.0.0.1 for development.",
        epilog=f"The state file is --state, else ${STATE_ENV}, else ./{DEFAULT_STATE}. "
        "Exit codes: 0 ok, 1 operation failed, 2 usage or state-file problem.",
    )
    state = argparse.ArgumentParser(add_help=False)
    state.add_argument(
        "--state",
        default=None,
        metavar="PATH",
        help=f"state file (default: ${STATE_ENV} or ./{DEFAULT_STATE})",
    )
    secrets = argparse.ArgumentParser(add_help=False)
    secrets.add_argument(
        "--password",
        default=None,
        help="the data nodes' password, if the state file lacks it (default: the state file's, "
        "else none)",
    )
    secrets.add_argument(
        "--sentinel-password",
        default=None,
        help="the sentinels' password, if the file lacks it (default: the state file's, else none)",
    )
    timeout = argparse.ArgumentParser(add_help=False)
    timeout.add_argument("--timeout", type=float, default=30.0, help="seconds to wait (default 30)")
    commands = parser.add_subparsers(dest="command", required=True)

    up = commands.add_parser(
        "up",
        parents=[state],
        help="start a topology, print its settings, run until Ctrl-C",
        description="Start a topology, write the state file, print the settings to paste and "
        "run in the foreground until Ctrl-C/SIGTERM (`down` from another terminal sends that). "
        f"Every node listens on {HOST}; the sentinels' quorum is a majority of --sentinels, "
        f"their failover-timeout {DEFAULT_FAILOVER_TIMEOUT_MS} ms, parallel-syncs 1; no "
        "persistence.",
    )
    up.add_argument("--shards", type=int, default=2, help="number of masters (default 2)")
    up.add_argument("--replicas", type=int, default=1, help="replicas per master (default 1)")
    up.add_argument("--sentinels", type=int, default=3, help="number of sentinels (default 3)")
    up.add_argument(
        "--masters",
        default=None,
        metavar="NAMES",
        help="comma-separated master names, one per shard (default shard0,shard1,...)",
    )
    up.add_argument(
        "--server",
        default=None,
        help="redis, valkey, embedded, auto or a binary path (default: $SENTINEL_CACHE_SERVER "
        "or auto)",
    )
    up.add_argument(
        "--port-base",
        type=int,
        default=None,
        metavar="N",
        help="stable ports: data nodes on N, N+1, ... (shard by shard, master first), then the "
        f"sentinels (default {DEFAULT_PORT_BASE}, so pasted settings stay valid across runs; "
        "random free ports if one of those is taken; 0: random free ports)",
    )
    up.add_argument(
        "--down-after-ms",
        type=int,
        default=DEFAULT_DOWN_AFTER_MS,
        help="sentinel down-after-milliseconds: how long a master must not answer before the "
        f"sentinels fail it over (default {DEFAULT_DOWN_AFTER_MS})",
    )
    up.add_argument(
        "--password", default=None, help="requirepass for the data nodes (default: none)"
    )
    up.add_argument(
        "--sentinel-password", default=None, help="requirepass for the sentinels (default: none)"
    )
    up.add_argument(
        "--print-secrets",
        action="store_true",
        help="also write the passwords into the state file (then the other commands need no "
        "--password)",
    )
    up.add_argument("--json", action="store_true", help="print the settings as one JSON line")
    up.add_argument(
        "--detach",
        action="store_true",
        help="run in the background once started; the state file is the handle (`down` stops it)",
    )
    up.add_argument("--detached-child", action="store_true", help=argparse.SUPPRESS)

    status = commands.add_parser(
        "status",
        parents=[state, secrets],
        help="each master as the sentinels name it, its replicas, and which processes run",
    )
    status.add_argument("--json", action="store_true", help="print one JSON object")

    failover = commands.add_parser(
        "failover",
        parents=[state, secrets, timeout],
        help="SENTINEL FAILOVER NAME, wait for the new master, print old -> new",
    )
    failover.add_argument("name", help="master name")

    kill = commands.add_parser(
        "kill-master",
        parents=[state, secrets, timeout],
        help="SIGKILL the current master of NAME, wait for the failover, print old -> new",
    )
    kill.add_argument("name", help="master name")

    commands.add_parser(
        "down",
        parents=[state, timeout],
        help="stop the topology started by `up` and wait until it is gone",
    )

    demo.add_parser(commands)

    cli = commands.add_parser(
        "cli",
        parents=[state],
        help="send one command to 127.0.0.1:PORT and print the reply (like redis-cli)",
        description="Send one command to 127.0.0.1:PORT with redis-py and print the reply "
        "roughly as redis-cli does. The password comes from --password, else from the state "
        "file (the sentinels' one for a sentinel port) when it holds it.",
    )
    cli.add_argument(
        "--password",
        default=None,
        help="password for AUTH (default: the state file's, when it holds it; else none)",
    )
    cli.add_argument("port", type=int, help="a port on 127.0.0.1")
    cli.add_argument("args", nargs=argparse.REMAINDER, metavar="COMMAND", help="command and args")
    return parser


def state_payload(cluster: LocalSentinelCluster, *, with_secrets: bool) -> dict[str, Any]:
    """What the state file holds: no password unless ``with_secrets``."""
    payload: dict[str, Any] = {
        "version": STATE_VERSION,
        "pid": os.getpid(),
        "started": time.time(),
        "server": {
            "binary": cluster.server_binary,
            "kind": cluster.server_kind,
            "version": cluster.server_version,
        },
        "tmpdir": cluster.tmpdir,
        "masters": list(cluster.master_names),
        "sentinels": cluster.config()["sentinels"],
        "port_base": cluster.port_base,
        "processes": [
            {k: p[k] for k in ("role", "index", "port", "pid", "shard")}
            for p in cluster.processes()
        ],
        "password_set": cluster.requirepass is not None,
        "sentinel_password_set": cluster.sentinel_requirepass is not None,
        "url": cluster.url(credentials=with_secrets),
    }
    if with_secrets:
        payload["password"] = cluster.requirepass
        payload["sentinel_password"] = cluster.sentinel_requirepass
    return payload


# --------------------------------------------------------------------------- up


def _check_password(option: str, value: str | None) -> None:
    """The servers' config files take a password as one bare word."""
    if value is not None and (not value or any(c.isspace() or c in "\"'" for c in value)):
        raise StateError(f"{option} must be non-empty, without whitespace or quotes")


def _check_no_running_topology(path: Any) -> None:
    try:
        existing = Topology.load(path)
    except StateError:
        return  # none, or unreadable: it is replaced
    if existing.up_alive():
        raise StateError(
            f"a topology (pid {existing.pid}) is already running with the state file {path}; "
            f"stop it with `{PROG} down{_state_flag(path)}` or choose another --state"
        )


def _state_flag(path: Any) -> str:
    """`` --state PATH`` unless ``path`` is what the other commands find by themselves."""
    return "" if state_path(None) == path else f" --state {shlex.quote(str(path))}"


def up(args: argparse.Namespace) -> int:
    """Start, print, then block until SIGINT/SIGTERM/SIGHUP; always stop what was started."""
    path = state_path(args.state)
    try:
        _check_password("--password", args.password)
        _check_password("--sentinel-password", args.sentinel_password)
        _check_no_running_topology(path)
    except StateError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return _USAGE
    if args.detach:
        return _detach(args, path)
    done = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        done.set()

    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, on_signal)
    masters = None
    if args.masters is not None:
        masters = [m.strip() for m in args.masters.split(",")]
    chosen = args.port_base
    base = DEFAULT_PORT_BASE if chosen is None else (chosen or None)
    while True:
        try:
            cluster = LocalSentinelCluster(
                args.shards,
                args.replicas,
                args.sentinels,
                down_after_ms=args.down_after_ms,
                server=args.server,
                master_names=masters,
                requirepass=args.password,
                sentinel_requirepass=args.sentinel_password,
                port_base=base,
            )
        except (RuntimeError, ValueError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return _USAGE
        try:
            cluster.start()
            break
        except PortTakenError as exc:
            cluster.stop()
            if chosen is not None or base is None:
                print(f"error: {exc}", file=sys.stderr)
                return _FAILED
            # The default ports are busy (another topology, another program): any free ones.
            if not args.json:  # --json prints one JSON line, nothing else
                print(f"# {exc}: random free ports instead (--port-base N chooses)", flush=True)
            base = None
        except (RuntimeError, TimeoutError) as exc:
            cluster.stop()
            print(f"error: {exc}", file=sys.stderr)
            return _FAILED
    try:
        write_state(path, state_payload(cluster, with_secrets=args.print_secrets))
        if args.json:
            print(settings_json(cluster, str(path)), flush=True)
        else:
            print(settings_text(cluster))
            stop = "" if args.detached_child else "Ctrl-C or "
            print(
                f"\n# started in {cluster.startup_seconds:.2f}s; logs in {cluster.tmpdir}\n"
                f"# state in {path}; {stop}`{PROG} down{_state_flag(path)}` stops it",
                flush=True,
            )
        if args.detached_child:
            _let_go_of_output()
        while not done.wait(0.5):
            pass
    finally:
        cluster.stop()
        remove_state(path, os.getpid())
    if not args.json and not args.detached_child:
        print("# stopped", flush=True)
    return 0


def _let_go_of_output() -> None:
    """Detached: point stdout/stderr at /dev/null, so the parent sees EOF and can exit."""
    sys.stdout.flush()
    sys.stderr.flush()
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)
    os.close(devnull)


def _child_argv(args: argparse.Namespace, path: Any) -> list[str]:
    argv = [sys.executable, "-m", "sentinel_cache.testing", "up", "--state", str(path)]
    for option in ("shards", "replicas", "sentinels", "down_after_ms"):
        argv += [f"--{option.replace('_', '-')}", str(getattr(args, option))]
    for option in ("masters", "server", "port_base", "password", "sentinel_password"):
        value = getattr(args, option)
        if value is not None:
            argv += [f"--{option.replace('_', '-')}", str(value)]
    for flag in ("print_secrets", "json"):
        if getattr(args, flag):
            argv.append(f"--{flag.replace('_', '-')}")
    return [*argv, "--detached-child"]


def _detach(args: argparse.Namespace, path: Any) -> int:
    """Run ``up`` as a child in its own session; return once it started (or failed)."""
    child = subprocess.Popen(
        _child_argv(args, path),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # Ctrl-C in this terminal and its hang-up do not reach it
        text=True,
    )
    assert child.stdout is not None
    output = child.stdout.read()  # until it lets go of its output (started) or exits
    child.stdout.close()
    deadline = time.monotonic() + 10
    while True:
        rc = child.poll()
        if rc is not None:
            sys.stderr.write(output)
            return rc or _FAILED
        try:
            if Topology.load(path).pid == child.pid:
                break
        except StateError:
            pass
        if time.monotonic() > deadline:
            child.kill()
            child.wait()
            sys.stderr.write(output)
            print("error: the detached topology did not write its state file", file=sys.stderr)
            return _FAILED
        time.sleep(0.05)
    child.returncode = 0  # it runs on, orphaned on purpose: no "still running" warning
    sys.stdout.write(output)
    if not args.json:
        print(f"# detached: pid {child.pid}", flush=True)
    return 0


# --------------------------------------------------------------------------- the other commands


def _load(args: argparse.Namespace) -> Topology:
    return Topology.load(
        state_path(args.state),
        password=getattr(args, "password", None),
        sentinel_password=getattr(args, "sentinel_password", None),
    )


def _address(address: tuple[str, int]) -> str:
    return f"{address[0]}:{address[1]}"


def status(args: argparse.Namespace) -> int:
    topology = _load(args)
    try:
        topology.require_passwords(node=False)
        report = topology.status()
    finally:
        topology.close()
    if args.json:
        print(json.dumps(report))
    else:
        server = report["server"]
        print(
            f"topology of pid {report['pid']} "
            f"({'running' if report['running'] else 'NOT RUNNING'}): "
            f"{server.get('kind')} {server.get('version')} ({server.get('binary')}); "
            f"state {report['state']}"
        )
        for name, shard in report["masters"].items():
            answered = [a for a in shard["sentinels"].values() if a is not None]
            agreement = f"{len(answered)}/{len(shard['sentinels'])} sentinels answer"
            if answered and not shard["agree"]:
                agreement += ", DISAGREEING: " + ", ".join(answered)
            print(f"{name}: master {shard['master'] or '(none)'} ({agreement})")
            for replica in shard["replicas"]:
                print(
                    f"  replica {replica['address']} ({replica['flags']}, link {replica['link']})"
                )
        print("processes:")
        for proc in report["processes"]:
            print(
                f"  {proc['role']:<8} {proc['address']:<16} pid {proc['pid']!s:<8} "
                f"{proc['shard'] or '':<10} {'alive' if proc['alive'] else 'DEAD'}"
            )
    healthy = report["running"] and all(m["master"] for m in report["masters"].values())
    return 0 if healthy else _FAILED


def failover(args: argparse.Namespace) -> int:
    topology = _load(args)
    try:
        topology.check_master(args.name)
        topology.require_passwords(node=True)
        old, new = topology.failover(args.name, args.timeout)
    finally:
        topology.close()
    print(f"{args.name}: {_address(old)} -> {_address(new)}")
    return 0


def kill_master(args: argparse.Namespace) -> int:
    topology = _load(args)
    try:
        topology.check_master(args.name)
        topology.require_passwords(node=True)
        old, new, pid = topology.kill_master(args.name, args.timeout)
    finally:
        topology.close()
    print(f"{args.name}: {_address(old)} -> {_address(new)} (killed pid {pid})")
    return 0


def down(args: argparse.Namespace) -> int:
    topology = _load(args)
    print(topology.down(args.timeout))
    return 0


def format_reply(reply: Any) -> str:
    """A reply roughly as redis-cli prints it (strings raw, as it does for INFO)."""
    if isinstance(reply, bytes):
        return reply.decode("utf-8", "replace")
    if isinstance(reply, int):
        return f"(integer) {int(reply)}"
    if isinstance(reply, float):
        return f"(double) {reply}"
    if reply is None:
        return "(nil)"
    if isinstance(reply, dict):
        reply = [x for pair in reply.items() for x in pair]
    if isinstance(reply, (list, tuple, set)):
        items = list(reply)
        if not items:
            return "(empty array)"
        width = len(str(len(items)))
        lines = []
        for i, item in enumerate(items, 1):
            prefix = f"{i:>{width}}) "
            text = format_reply(item)
            if isinstance(item, (bytes, str)) and (not text or any(c.isspace() for c in text)):
                text = json.dumps(text)  # quoted, as redis-cli shows strings in arrays
            lines.append(prefix + text.replace("\n", "\n" + " " * len(prefix)))
        return "\n".join(lines)
    return str(reply)


def cli(args: argparse.Namespace) -> int:
    if not args.args:
        print("error: cli needs a command, e.g. `cli 7000 PING`", file=sys.stderr)
        return _USAGE
    password = args.password
    hint = ""
    if password is None:
        try:
            topology = Topology.load(state_path(args.state))
        except StateError:
            topology = None  # no state file: any port, no password
        if topology is not None:
            proc = topology.process_at(args.port)
            sentinel = proc is not None and proc["role"] == "sentinel"
            password = topology.sentinel_password if sentinel else topology.password
            if password is None and topology.data.get(
                "sentinel_password_set" if sentinel else "password_set"
            ):
                hint = " (the state file does not hold the password: pass --password)"
    connection = redis.Connection(
        host=HOST,
        port=args.port,
        password=password,
        protocol=2,
        socket_timeout=10.0,
        socket_connect_timeout=2.0,
    )
    try:
        connection.connect()
        connection.send_command(*args.args)
        reply = connection.read_response()
    except redis.AuthenticationError as exc:
        print(f"(error) {exc}{hint}")
        return _FAILED
    except redis.ResponseError as exc:
        print(f"(error) {exc}{hint if 'NOAUTH' in str(exc) else ''}")
        return _FAILED
    except (redis.ConnectionError, redis.TimeoutError, OSError) as exc:
        print(f"error: {HOST}:{args.port}: {exc}", file=sys.stderr)
        return _FAILED
    finally:
        connection.disconnect()
    print(format_reply(reply))
    return 0


_COMMANDS = {
    "up": up,
    "status": status,
    "failover": failover,
    "kill-master": kill_master,
    "down": down,
    "cli": cli,
    "demo": demo.main,
}


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return _COMMANDS[args.command](args)
    except StateError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return _USAGE
    except OperationError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return _FAILED
    except BrokenPipeError:  # e.g. `status | head`: stop quietly
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return _FAILED


if __name__ == "__main__":
    sys.exit(main())
