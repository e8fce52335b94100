"""``make run``: a local topology and the example Django project, for a person to click through.

Starts 2 shards (master + replica each) and 3 sentinels on loopback, serves the example project
on http://127.0.0.1:8000/ (or a free port when 8000 is taken; ``--port`` to choose), prints the
URL, the login and the commands to try, and stops everything on Ctrl-C.
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import signal
import sys
import threading
from collections.abc import Sequence
from types import FrameType

from example_project.demo import PASSWORD, USERNAME


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m example_project.run", description=__doc__)
    parser.add_argument("--port", type=int, default=8000, help="HTTP port (default 8000)")
    parser.add_argument(
        "--server", default=None, help="redis, valkey, embedded or a binary path (default: auto)"
    )
    args = parser.parse_args(argv)

    from example_project.server import DjangoServer, ensure_user, setup_django
    from sentinel_cache.core.topology.sharded_pool import close_all
    from sentinel_cache.testing import LocalSentinelCluster

    done = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        done.set()

    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, on_signal)

    cluster = LocalSentinelCluster(shards=2, replicas=1, sentinels=3, server=args.server)
    server = None
    try:
        cluster.start()
        config = cluster.config()
        setup_django(
            config["sentinels"],
            config["masters"],
            database=os.path.join(str(cluster.tmpdir), "example.sqlite3"),
        )
        ensure_user(USERNAME, PASSWORD)
        try:
            server = DjangoServer(port=args.port).start()
        except OSError:
            server = DjangoServer(port=0).start()  # 8000 is taken: any free port
        env = " ".join(
            f"{name}={shlex.quote(os.environ[name])}"
            for name in ("SENTINEL_CACHE_SENTINELS", "SENTINEL_CACHE_MASTERS")
        )
        first = config["masters"][0]
        port = cluster.sentinel_addresses[0][1]
        failover = (
            f"redis-cli -p {port} SENTINEL FAILOVER {first}"
            if shutil.which("redis-cli")
            else f'.venv/bin/python -c "import redis; print(redis.Redis(port={port})'
            f".execute_command('SENTINEL', 'FAILOVER', '{first}'))\""
        )
        print(
            f"""
sentinel_cache example project: {server.url}/

  log in as {USERNAME} / {PASSWORD}; the session lives in the sharded cache
  pages: /report/ (low-level cache), /clock/ (cache_page), /account/, /shards/ (shard map),
         /api/flag/ (a feature flag through the near cache)

Topology ({cluster.server_kind} {cluster.server_version}, logs in {cluster.tmpdir}):
  sentinels {", ".join(config["sentinels"])}, masters {", ".join(config["masters"])}

In another terminal:
  {env} .venv/bin/python -m example_project.manage sentinel_status
  {env} .venv/bin/flask --app example_project.flask_app run --port 5000
  {failover}   # then reload /shards/

Ctrl-C stops the server and the topology.""",
            flush=True,
        )
        while not done.wait(0.5):
            pass
        print("\nstopping...", flush=True)
    finally:
        if server is not None:
            server.stop()
        close_all()
        cluster.stop()
    print("stopped", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
