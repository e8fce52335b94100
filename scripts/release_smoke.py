# ruff: noqa: TID251  (a smoke test of the framework adapters imports the frameworks)
"""Smoke test of an installed release (run by scripts/release_check.sh, in a clean virtualenv).

It must run with the interpreter of a virtualenv that installed the wheel with the
``[django,flask,embedded]`` extras, from a directory outside the checkout (``python -I``, so
neither the script's directory nor ``PYTHONPATH`` can put the checkout on ``sys.path``). It:

1. checks that ``sentinel_cache`` is imported from that virtualenv, not from the checkout, with its
   ``py.typed``, LICENSE and version;
2. runs ``python -m sentinel_cache.testing demo`` (a failover under a write/read loop: no
   failed call, no lost write), as the README's first step after ``pip install``;
3. starts a real local topology (2 shards with a replica each, 3 sentinels; the embedded Valkey
   from the ``[embedded]`` extra by default) with ``sentinel_cache.testing.LocalSentinelCluster``;
4. Django: ``settings.configure`` with the backend, set/get/get_many, ``manage.py check`` and
   ``sentinel_status``, a planned failover of one shard, then reads and writes again;
5. Flask: an app with Flask-Caching's ``Cache(app)``, the same, failing over the other shard, and
   ``flask sentinel-status``.

Exit code 0 when every step passed; any failure raises (non-zero exit, traceback).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import io
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

DISTRIBUTION = "sentinel-cache"
KEYS = 40  # enough that both shards get keys (each key lands on one of two at random)
SWITCH_TIMEOUT = 20.0


def say(message: str) -> None:
    print(f"  smoke: {message}", flush=True)


def inside(path: Path, directory: Path) -> bool:
    return path == directory or directory in path.parents


def check_installation(checkout: Path) -> str:
    """The package comes from this virtualenv, complete; returns its version."""
    import sentinel_cache

    prefix = Path(sys.prefix).resolve()
    module = Path(sentinel_cache.__file__).resolve()
    cwd = Path.cwd().resolve()
    assert sys.prefix != sys.base_prefix, f"{sys.executable} is not a virtualenv's interpreter"
    assert inside(module, prefix), f"sentinel_cache imported from {module}, not from {prefix}"
    assert not inside(module, checkout), f"sentinel_cache imported from the checkout: {module}"
    assert not inside(prefix, checkout), f"the virtualenv {prefix} is inside the checkout"
    assert not inside(cwd, checkout), f"running from {cwd}, inside the checkout"
    assert (module.parent / "py.typed").is_file(), "py.typed is not installed"
    installed = importlib.metadata.version(DISTRIBUTION)
    assert installed == sentinel_cache.__version__, (
        f"metadata says {installed}, sentinel_cache.__version__ is {sentinel_cache.__version__}"
    )
    files = importlib.metadata.distribution(DISTRIBUTION).files or []
    assert any(f.name == "LICENSE" for f in files), "LICENSE is not in the installed dist-info"
    # The documented command line starts (its help; `up` runs until Ctrl-C).
    subprocess.run(
        [sys.executable, "-I", "-m", "sentinel_cache.testing", "up", "--help"],
        check=True,
        capture_output=True,
        timeout=60,
    )
    say(f"sentinel_cache {installed} imported from {module.parent}")
    return installed


def check_demo(server: str) -> None:
    """The README's first step after ``pip install``: the demo, from the wheel alone."""
    result = subprocess.run(
        [sys.executable, "-I", "-m", "sentinel_cache.testing", "demo", "--server", server],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert result.returncode == 0, (
        f"the demo exited {result.returncode}:\n{result.stdout}{result.stderr}"
    )
    assert ", 0 failed, 0 acknowledged writes lost" in result.stdout, result.stdout
    summary = [line.strip() for line in result.stdout.splitlines() if " calls (" in line]
    say(f"python -m sentinel_cache.testing demo passed: {summary[0] if summary else '?'}")


def keys_on(cluster: Any, address: tuple[str, int], pattern: str) -> int:
    client = cluster.node_client(address)
    try:
        return sum(1 for _ in client.scan_iter(match=pattern, count=1000))
    finally:
        client.close()


def fail_over(cluster: Any, name: str, core: Any) -> tuple[str, int]:
    """Planned failover of ``name``; returns the new master once the cache follows it."""
    cluster.wait_for_replication(name)  # every acknowledged write is on the replica
    old = cluster.master_address(name)
    started = time.monotonic()
    cluster.failover(name)
    new = cluster.wait_for_master_change(name, old, timeout=SWITCH_TIMEOUT)
    deadline = time.monotonic() + SWITCH_TIMEOUT
    while core.shard(name).address != tuple(new):
        assert time.monotonic() < deadline, f"the cache never followed {name} to {new}"
        time.sleep(0.02)
    say(
        f"failover of {name}: {old[0]}:{old[1]} -> {new[0]}:{new[1]}, "
        f"followed after {time.monotonic() - started:.2f}s"
    )
    return new


def check_reads_and_writes(
    set_many: Callable[[dict[str, Any]], Any],
    get_many: Callable[[list[str]], dict[str, Any]],
    label: str,
) -> dict[str, Any]:
    data = {f"{label}:{i}": {"n": i, "label": label} for i in range(KEYS)}
    set_many(data)
    found = get_many(list(data))
    assert found == data, f"{label}: get_many returned {len(found)} of {len(data)} values"
    return data


def check_placement(cluster: Any, stored_pattern: str, name: str, new: tuple[str, int]) -> None:
    """The keys written after the failover are on the masters, some on the promoted one."""
    masters = {n: cluster.master_address(n) for n in cluster.master_names}
    assert masters[name] == tuple(new), f"{name}: sentinels report {masters[name]}, not {new}"
    counts = {n: keys_on(cluster, address, stored_pattern) for n, address in masters.items()}
    assert sum(counts.values()) == KEYS, f"{stored_pattern}: {counts} on the masters, not {KEYS}"
    assert counts[name] > 0, f"no key of {stored_pattern} on the promoted master of {name}"


def check_django(cluster: Any, sentinels: list[str], name: str) -> None:
    import django
    from django.conf import settings

    settings.configure(
        DEBUG=False,
        SECRET_KEY="release-smoke-" + "x" * 40,
        INSTALLED_APPS=["sentinel_cache"],
        CACHES={
            "default": {
                "BACKEND": "sentinel_cache.django.ShardedSentinelCache",
                "LOCATION": sentinels,
                "OPTIONS": {"MASTERS": list(cluster.master_names)},
                "KEY_PREFIX": "smoke-django",
            }
        },
    )
    django.setup()
    from django.core.cache import cache
    from django.core.management import call_command

    call_command("check", stdout=io.StringIO())
    cache.set("greeting", "hello", timeout=60)
    assert cache.get("greeting") == "hello", "Django: get after set"
    assert cache.get_or_set("computed", lambda: 42) == 42
    before = check_reads_and_writes(cache.set_many, cache.get_many, "before")
    out = io.StringIO()
    try:
        call_command("sentinel_status", "--json", stdout=out)
    except SystemExit as exc:  # 1: degraded (serving), 2: down
        assert exc.code == 1, f"sentinel_status exited {exc.code}: {out.getvalue()}"
    assert all(n in out.getvalue() for n in cluster.master_names), out.getvalue()
    say(f"Django {django.get_version()}: set/get/get_many, check and sentinel_status passed")

    new = fail_over(cluster, name, cache.core)  # type: ignore[attr-defined]
    assert cache.get_many(list(before)) == before, "Django: values lost by the failover"
    assert cache.get("greeting") == "hello"
    cache.set("greeting", "hello again")
    assert cache.get("greeting") == "hello again"
    check_reads_and_writes(cache.set_many, cache.get_many, "after")
    check_placement(cluster, "smoke-django:1:after:*", name, new)
    say("Django: reads and writes after the failover passed")


def check_flask(cluster: Any, sentinels: list[str], name: str) -> None:
    from flask import Flask
    from flask_caching import Cache

    from sentinel_cache.flask import ShardedSentinelCache

    app = Flask("release_smoke")
    app.config.update(
        CACHE_TYPE="sentinel_cache.flask.ShardedSentinelCache",
        CACHE_REDIS_SENTINELS=sentinels,
        CACHE_REDIS_SENTINEL_MASTERS=list(cluster.master_names),
        CACHE_KEY_PREFIX="smoke-flask:",
    )
    cache = Cache(app)

    @app.route("/hello/<who>")
    @cache.cached(timeout=60)
    def hello(who: str) -> str:
        return f"hello {who} at {time.monotonic()}"

    client = app.test_client()
    with app.app_context():
        backend = cache.cache
        assert isinstance(backend, ShardedSentinelCache), f"Cache(app) built {backend!r}"
        cache.set("greeting", "hello")
        assert cache.get("greeting") == "hello", "Flask: get after set"

        def get_many(keys: list[str]) -> dict[str, Any]:
            return {k: v for k, v in zip(keys, cache.get_many(*keys), strict=True) if v is not None}

        before = check_reads_and_writes(cache.set_many, get_many, "before")
        first = client.get("/hello/world").get_data(as_text=True)
        assert client.get("/hello/world").get_data(as_text=True) == first, "view not cached"
        result = app.test_cli_runner().invoke(args=["sentinel-status", "--json"])
        assert result.exit_code in (0, 1), f"sentinel-status exited {result.exit_code}: {result}"
        report = json.loads(result.output)
        assert all(n in json.dumps(report) for n in cluster.master_names), result.output
        say(
            f"Flask {importlib.metadata.version('flask')} + Flask-Caching "
            f"{importlib.metadata.version('flask-caching')}: set/get/get_many, a cached view "
            "and sentinel-status passed"
        )

        new = fail_over(cluster, name, backend.core)
        assert get_many(list(before)) == before, "Flask: values lost by the failover"
        assert client.get("/hello/world").get_data(as_text=True) == first, "cached view lost"
        cache.set("greeting", "hello again")
        assert cache.get("greeting") == "hello again"
        check_reads_and_writes(cache.set_many, get_many, "after")
        check_placement(cluster, "smoke-flask:after:*", name, new)
    say("Flask: reads and writes after the failover passed")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkout", required=True, type=Path, help="the source checkout")
    parser.add_argument(
        "--server",
        default=os.environ.get("RELEASE_SMOKE_SERVER", "embedded"),
        help="server kind for the topology (default: embedded, from the [embedded] extra)",
    )
    args = parser.parse_args()
    # A SIGTERM (release_check.sh's `timeout`) unwinds, so the topology below is stopped.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    began = time.monotonic()
    version = check_installation(args.checkout.resolve())
    check_demo(args.server)

    from sentinel_cache.core.topology.sharded_pool import close_all
    from sentinel_cache.testing import LocalSentinelCluster

    cluster = LocalSentinelCluster(shards=2, replicas=1, sentinels=3, server=args.server)
    with cluster:
        say(f"{cluster!r} started in {cluster.startup_seconds:.2f}s")
        sentinels = list(cluster.config()["sentinels"])
        first, second = cluster.master_names
        try:
            check_django(cluster, sentinels, first)
            check_flask(cluster, sentinels, second)
        finally:
            with contextlib.suppress(Exception):
                close_all()
    say(
        f"PASSED: sentinel-cache {version} on {cluster.server_kind} {cluster.server_version}, "
        f"Django and Flask through a failover each, in {time.monotonic() - began:.1f}s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
