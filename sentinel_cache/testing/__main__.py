"""``python -m sentinel_cache.testing up``: run a local Sentinel topology until Ctrl-C/SIGTERM.

It prints the settings to paste into a Django or Flask project (or, with ``--json``, one JSON
line for scripts), so trying the library needs no Redis setup of one's own.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
from collections.abc import Sequence
from types import FrameType
from typing import Any

from sentinel_cache.testing.cluster import LocalSentinelCluster


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m sentinel_cache.testing",
        description="Run a local Redis/Valkey Sentinel topology on 127.0.0.1 for development.",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    up = commands.add_parser("up", help="start a topology, print its settings, wait for Ctrl-C")
    up.add_argument("--shards", type=int, default=2, help="number of masters (default 2)")
    up.add_argument("--replicas", type=int, default=1, help="replicas per master (default 1)")
    up.add_argument("--sentinels", type=int, default=3, help="number of sentinels (default 3)")
    up.add_argument(
        "--server",
        default=None,
        help="redis, valkey, embedded, auto or a binary path (default: $SENTINEL_CACHE_SERVER "
        "or auto)",
    )
    up.add_argument(
        "--down-after-ms", type=int, default=1000, help="sentinel down-after-milliseconds"
    )
    up.add_argument("--password", default=None, help="requirepass for the data nodes")
    up.add_argument("--sentinel-password", default=None, help="requirepass for the sentinels")
    up.add_argument("--json", action="store_true", help="print the settings as one JSON line")
    return parser


def settings_text(cluster: LocalSentinelCluster) -> str:
    """The copy-paste block for Django, Flask and the environment."""
    config = cluster.config()
    options: dict[str, Any] = {"MASTERS": config["masters"]}
    if config["password"] is not None:
        options["PASSWORD"] = config["password"]
    if config["sentinel_password"] is not None:
        options["SENTINEL_PASSWORD"] = config["sentinel_password"]
    # json.dumps renders str and list[str] as valid Python literals with double quotes.
    lines = [
        f"# {cluster!r}",
        "",
        "# Django settings.py",
        "CACHES = {",
        '    "default": {',
        '        "BACKEND": "sentinel_cache.django.ShardedSentinelCache",',
        f'        "LOCATION": {json.dumps(config["sentinels"])},',
        f'        "OPTIONS": {json.dumps(options)},',
        "    }",
        "}",
        "",
        "# Flask config",
        'CACHE_TYPE = "sentinel_cache.flask.ShardedSentinelCache"',
        f"CACHE_REDIS_SENTINELS = {json.dumps(config['sentinels'])}",
        f"CACHE_REDIS_SENTINEL_MASTERS = {json.dumps(config['masters'])}",
    ]
    if config["password"] is not None:
        lines.append(f"CACHE_REDIS_PASSWORD = {json.dumps(config['password'])}")
    if config["sentinel_password"] is not None:
        lines.append(f"CACHE_REDIS_SENTINEL_PASSWORD = {json.dumps(config['sentinel_password'])}")
    lines += ["", "# Environment", f"SENTINEL_CACHE_URL={cluster.url()}"]
    return "\n".join(lines)


def settings_json(cluster: LocalSentinelCluster) -> str:
    """:meth:`LocalSentinelCluster.config` plus the URL, server and pids, as one JSON line."""
    payload = dict(cluster.config())
    payload.update(
        url=cluster.url(),
        server_kind=cluster.server_kind,
        server_version=cluster.server_version,
        pids=cluster.pids,
    )
    return json.dumps(payload)


def up(args: argparse.Namespace) -> int:
    """Start, print, then block until SIGINT/SIGTERM/SIGHUP; always stop what was started."""
    done = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        done.set()

    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, on_signal)
    try:
        cluster = LocalSentinelCluster(
            args.shards,
            args.replicas,
            args.sentinels,
            down_after_ms=args.down_after_ms,
            server=args.server,
            requirepass=args.password,
            sentinel_requirepass=args.sentinel_password,
        )
    except (RuntimeError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        try:
            cluster.start()
        except (RuntimeError, TimeoutError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        if args.json:
            print(settings_json(cluster), flush=True)
        else:
            print(settings_text(cluster))
            print(
                f"\n# started in {cluster.startup_seconds:.2f}s; logs in {cluster.tmpdir}; "
                "Ctrl-C to stop",
                flush=True,
            )
        while not done.wait(0.5):
            pass
    finally:
        cluster.stop()
    if not args.json:
        print("# stopped", flush=True)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "up":
        return up(args)
    return 2  # pragma: no cover - argparse rejects unknown commands


if __name__ == "__main__":
    sys.exit(main())
