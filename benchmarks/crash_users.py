"""A crash failover as a site sees it (issue 36, item 5): 50 users logged in through Django's
cache sessions, served by gunicorn (4 sync workers) or uvicorn (2 workers), each user's client
requesting pages that load and save its session back to back, and the master holding most of
the sessions SIGKILLed under them. Counts responses 500, other failures, logouts (a page that
found its user gone), session writes lost (a page that read an older session than the one its
previous page saved: asynchronous replication's, not the cache's), the slowest request and the
time from the kill to the switch. Default options against ``OUTAGE_HOLD: 0`` side by side
(``off``: also ``OUTAGE_READS: False``, which logs users out: the count of logouts at work)::

    python -m benchmarks.crash_users [--server gunicorn|uvicorn|both] [--users 50]
        [--rounds 2] [--options default|hold0|off|both]

A fresh topology per round (2 shards, a replica each, 3 sentinels, ``down-after-milliseconds``
1000, as the demo). The Django app is this module itself (its settings, URLs, WSGI and ASGI
entry points below, read by the servers from ``CRASH_USERS_*`` variables), so the benchmark
needs nothing outside it. Not part of ``make test``: a round takes 10-15 s here. Exits 1
if a round with the default options failed a request or logged a user out.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from django.http import HttpRequest, JsonResponse
from django.urls import path

ROOT = Path(__file__).resolve().parent.parent
HOST = "127.0.0.1"
DOWN_AFTER_MS = 1000
REQUEST_TIMEOUT = 30.0  # a client gives up on a request after this: counted as an error
BEFORE_S, AFTER_S = 2.0, 3.0  # traffic before the kill, and after the switch
SESSION_PREFIX = "django.contrib.sessions.cache"
KEY_PREFIX = "crash"

# --------------------------------------------------------------------------- the app (servers)
# Settings read by the servers (DJANGO_SETTINGS_MODULE=benchmarks.crash_users); the benchmark's
# own process configures Django explicitly and never reads them.

SECRET_KEY = "crash-users-benchmark-only"
DEBUG = False
ALLOWED_HOSTS = [HOST]
INSTALLED_APPS: list[str] = []
MIDDLEWARE = ["django.contrib.sessions.middleware.SessionMiddleware"]
ROOT_URLCONF = "benchmarks.crash_users"
DATABASES: dict[str, Any] = {}
USE_TZ = True
SESSION_ENGINE = "django.contrib.sessions.backends.cache"
CACHES = {
    "default": {
        "BACKEND": "sentinel_cache.django.ShardedSentinelCache",
        "LOCATION": os.environ.get("CRASH_USERS_SENTINELS", f"{HOST}:26379").split(","),
        "KEY_PREFIX": KEY_PREFIX,
        "OPTIONS": {
            "MASTERS": os.environ.get("CRASH_USERS_MASTERS", "shard0,shard1").split(","),
            # Unset: the library's defaults, as a site that sets nothing else gets them.
            **(
                {"OUTAGE_HOLD": float(os.environ["CRASH_USERS_OUTAGE_HOLD"])}
                if os.environ.get("CRASH_USERS_OUTAGE_HOLD")
                else {}
            ),
            **({"OUTAGE_READS": False} if os.environ.get("CRASH_USERS_NO_OUTAGE_READS") else {}),
        },
    }
}
# A 500's cause (the exception and its traceback) in the server's log, where the report finds it.
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {
        "django.request": {"handlers": ["console"], "level": "ERROR", "propagate": False},
        "sentinel_cache": {"handlers": ["console"], "level": "WARNING", "propagate": False},
    },
}


def login(request: HttpRequest) -> JsonResponse:
    """``/login?user=NAME``: the user is in the session from now on (Django's login stores the
    user's id in the session the same way)."""
    request.session.cycle_key()
    request.session["user"] = request.GET["user"]
    request.session["n"] = 0
    from django.core.cache import cache

    config = cache.core.config  # type: ignore[attr-defined]
    return JsonResponse(
        {"user": request.session["user"], "n": 0, "hold": config.outage_hold,
         "outage_reads": config.outage_reads}
    )  # fmt: skip


def page(request: HttpRequest) -> JsonResponse:
    """A page of a logged-in user: loads the session, changes it (saved by SessionMiddleware)
    and says whose it was and which save it had seen."""
    user = request.session.get("user")
    seen = request.session.get("n", -1)
    if user is not None:
        request.session["n"] = seen + 1
    return JsonResponse({"user": user, "n": seen})


urlpatterns = [path("login", login), path("page", page)]

_apps: dict[str, Any] = {}


def wsgi(environ: dict[str, Any], start_response: Any) -> Any:
    """gunicorn's entry point (``benchmarks.crash_users:wsgi``), Django set up on first use."""
    app = _apps.get("wsgi")
    if app is None:
        from django.core.wsgi import get_wsgi_application

        app = _apps["wsgi"] = get_wsgi_application()
    return app(environ, start_response)


async def asgi(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """uvicorn's entry point (``benchmarks.crash_users:asgi``)."""
    app = _apps.get("asgi")
    if app is None:
        from django.core.asgi import get_asgi_application

        app = _apps["asgi"] = get_asgi_application()
    await app(scope, receive, send)


# --------------------------------------------------------------------------- counting


@dataclass
class Request:
    """One page request of one user: when (seconds from the kill), its status (0: no answer)."""

    user: int
    started: float
    ended: float
    status: int
    logged_out: bool = False  # answered, but the session had no user (or not this one)
    new_cookie: bool = False  # the server replaced the user's session key
    stale: bool = False  # the session read was older than the one the previous page saved
    error: str | None = None  # no answer: the client's exception


@dataclass
class Tally:
    """What a round's requests add up to."""

    requests: int = 0
    after_kill: int = 0  # begun between the kill and the switch
    status_500: int = 0
    other_failures: Counter[str] = field(default_factory=Counter)  # "503", "timeout: ..."
    logouts: int = 0
    users_logged_out: int = 0
    stale: int = 0
    slowest_s: float = 0.0
    first_500_s: float | None = None  # from the kill
    last_500_s: float | None = None

    @property
    def failures(self) -> int:
        return self.status_500 + sum(self.other_failures.values())


def tally(requests: Sequence[Request], switch_s: float) -> Tally:
    """Adds up ``requests`` (times from the kill, which the switch followed by ``switch_s``)."""
    out = Tally(requests=len(requests))
    out_users: set[int] = set()
    for r in requests:
        out.slowest_s = max(out.slowest_s, r.ended - r.started)
        out.after_kill += 0 <= r.started < switch_s
        if r.status == 500:
            out.status_500 += 1
            out.first_500_s = (
                r.started if out.first_500_s is None else min(out.first_500_s, r.started)
            )
            out.last_500_s = r.ended if out.last_500_s is None else max(out.last_500_s, r.ended)
        elif r.status != 200:
            out.other_failures[r.error or f"HTTP {r.status}"] += 1
        if r.logged_out or r.new_cookie:
            out.logouts += 1
            out_users.add(r.user)
        out.stale += r.stale
    out.users_logged_out = len(out_users)
    return out


_EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Interrupted)\b:? ?.*$")


_CHAINED = ("The above exception was the direct cause", "During handling of the above exception")


def logged_causes(log: str) -> Counter[str]:
    """The last exception of every traceback in a server's log (what a 500 was), counted: an
    exception another one was raised from is its cause's detail, not a second error."""
    lines = [line.strip() for line in log.splitlines()]
    causes: Counter[str] = Counter()
    for i, line in enumerate(lines):
        if not _EXCEPTION_LINE.match(line):
            continue
        following = next((rest for rest in lines[i + 1 :] if rest), "")
        if not following.startswith(_CHAINED):
            causes[line[:300]] += 1
    return causes


# --------------------------------------------------------------------------- a round


def _get(port: int, target: str, cookie: str | None) -> tuple[int, dict[str, Any], str | None]:
    """``GET target`` on a fresh connection: status, JSON body, the session cookie it set."""
    conn = http.client.HTTPConnection(HOST, port, timeout=REQUEST_TIMEOUT)
    try:
        headers = {"Connection": "close"}
        if cookie:
            headers["Cookie"] = f"sessionid={cookie}"
        conn.request("GET", target, headers=headers)
        response = conn.getresponse()
        raw = response.read()
        set_cookie = None
        for name, value in response.getheaders():
            if name.lower() == "set-cookie" and value.startswith("sessionid="):
                set_cookie = value.split(";", 1)[0].split("=", 1)[1]
    finally:
        conn.close()
    try:
        body = json.loads(raw) if response.status == 200 else {}
    except ValueError:
        body = {}
    return response.status, body, set_cookie


def _server_argv(server: str, port: int) -> list[str]:
    if server == "gunicorn":
        return [
            sys.executable,
            "-m",
            "gunicorn",
            "--workers",
            "4",
            "--worker-class",
            "sync",
            "--bind",
            f"{HOST}:{port}",
            "--timeout",
            "60",
            "benchmarks.crash_users:wsgi",
        ]
    return [
        sys.executable,
        "-m",
        "uvicorn",
        "--workers",
        "2",
        "--host",
        HOST,
        "--port",
        str(port),
        "--lifespan",
        "off",
        "--no-access-log",
        "--log-level",
        "warning",
        "benchmarks.crash_users:asgi",
    ]


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


@dataclass
class Round:
    server: str
    options: str
    users: int
    switch_s: float
    tally: Tally
    causes: Counter[str]
    sessions_on_killed: int
    took_s: float
    served_with: str  # the options the server's cache reported at the logins


def _django_here() -> None:
    import django
    from django.conf import settings

    if not settings.configured:
        settings.configure(USE_TZ=True, INSTALLED_APPS=[], CACHES={})
        django.setup()


def one_round(server: str, options: str, users: int, log_dir: Path) -> Round:
    """A fresh topology, ``server`` serving the app, ``users`` logged in, the busiest master
    SIGKILLed under them."""
    _django_here()
    from sentinel_cache.django import ShardedSentinelCache
    from sentinel_cache.testing import LocalSentinelCluster
    from tests.threads import Workers

    began = time.monotonic()
    cluster = LocalSentinelCluster(shards=2, replicas=1, sentinels=3, down_after_ms=DOWN_AFTER_MS)
    cluster.start()
    config = cluster.config()
    port = _free_port()
    log_path = log_dir / f"crash_users-{server}-{options}-{os.getpid()}-{int(time.time())}.log"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(
            [str(ROOT), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
        ),
        "PYTHONUNBUFFERED": "1",
        "DJANGO_SETTINGS_MODULE": "benchmarks.crash_users",
        "CRASH_USERS_SENTINELS": ",".join(config["sentinels"]),
        "CRASH_USERS_MASTERS": ",".join(config["masters"]),
        "CRASH_USERS_OUTAGE_HOLD": "0" if options in ("hold0", "off") else "",
        "CRASH_USERS_NO_OUTAGE_READS": "1" if options == "off" else "",
    }
    # This process's own view of the topology: which shard a session is on, and when the
    # listeners' switch comes (the servers' cores hear the same +switch-master).
    watcher = ShardedSentinelCache(
        config["sentinels"], {"KEY_PREFIX": KEY_PREFIX, "OPTIONS": {"MASTERS": config["masters"]}}
    )
    popen = None
    try:
        with open(log_path, "wb") as log:
            popen = subprocess.Popen(
                _server_argv(server, port),
                cwd=ROOT,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + 30
        cookies: list[str] = []
        served_with = ""
        for n in range(users):  # log in; the first ones also wait for the server to be up
            while True:
                try:
                    status, body, cookie = _get(port, f"/login?user=u{n}", None)
                except OSError:
                    status, cookie = 0, None
                if status == 200 and cookie:
                    cookies.append(cookie)
                    served_with = (
                        f"OUTAGE_HOLD {body['hold']:g}, OUTAGE_READS {body['outage_reads']}"
                    )
                    break
                if popen.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(
                        f"{server} did not log u{n} in: {log_path.read_text()[-2000:]}"
                    )
                time.sleep(0.1)
        core = watcher.core
        core.discover()
        per_shard = Counter(core.shard_index(watcher.make_key(SESSION_PREFIX + c)) for c in cookies)
        index = per_shard.most_common(1)[0][0]
        shard, name = core.shards[index], config["masters"][index]
        for master in config["masters"]:  # every login on a replica: a crash loses none of them
            with cluster.node_client(cluster.master_address(master)) as node:
                node.execute_command("WAIT", 1, 5000)
        generation = shard.generation
        killed = [float("inf")]
        results: list[Request] = []
        lock = threading.Lock()

        def user(n: int, stop: threading.Event) -> None:
            cookie, last_saved = cookies[n], 0
            while not stop.is_set():
                started = time.monotonic()
                try:
                    status, body, new = _get(port, "/page", cookie)
                    error = None
                except (OSError, http.client.HTTPException) as exc:
                    status, body, new, error = 0, {}, None, f"{type(exc).__name__}: {exc}"
                ended = time.monotonic()
                r = Request(n, started, ended, status, error=error)
                if status == 200:
                    r.logged_out = body.get("user") != f"u{n}"
                    r.new_cookie = new is not None and new != cookie
                    r.stale = not r.logged_out and body.get("n", -1) < last_saved
                    if not r.logged_out:
                        last_saved = body["n"] + 1
                    if new:
                        cookie = new
                with lock:
                    results.append(r)

        with Workers(timeout=REQUEST_TIMEOUT + 10) as workers:
            for n in range(users):
                workers.spawn(user, n, workers.stop, name=f"user-{n}")
            time.sleep(BEFORE_S)
            old = cluster.kill_master(name)
            killed[0] = time.monotonic()
            while shard.generation == generation:
                if time.monotonic() > killed[0] + 30:
                    raise RuntimeError(f"no switch of {name} within 30 s of the kill")
                time.sleep(0.005)
            switch_s = time.monotonic() - killed[0]
            time.sleep(AFTER_S)
        cluster.wait_for_master_change(name, old, timeout=30)
        for r in results:
            r.started -= killed[0]
            r.ended -= killed[0]
        popen_log = log_path.read_text(errors="replace")
        return Round(
            server,
            options,
            users,
            switch_s,
            tally(results, switch_s),
            logged_causes(popen_log),
            per_shard[index],
            time.monotonic() - began,
            served_with,
        )
    finally:
        if popen is not None:
            for sig in (signal.SIGTERM, signal.SIGKILL):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(popen.pid, sig)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    popen.wait(5)
                    break
        watcher.core.close()
        cluster.stop()


def describe(r: Round) -> str:
    t = r.tally
    text = (
        f"{r.server:8} {r.options:7} ({r.served_with}) {r.users} users "
        f"({r.sessions_on_killed} sessions on the killed master): {t.requests} requests "
        f"({t.after_kill} begun between the kill and the switch), "
        f"{t.status_500} x 500, {t.failures - t.status_500} other failures, {t.logouts} logouts "
        f"({t.users_logged_out} users), {t.stale} stale session reads, slowest "
        f"{t.slowest_s:.2f} s, switch {r.switch_s:.2f} s after the kill; round {r.took_s:.0f} s"
    )
    if t.status_500:
        text += f"\n    500s from {t.first_500_s:+.2f} s to {t.last_500_s:+.2f} s after the kill"
    for failure, count in t.other_failures.most_common(5):
        text += f"\n    {count} x {failure}"
    for cause, count in r.causes.most_common(5):
        text += f"\n    server log: {count} x {cause}"
    return text


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--server", choices=["gunicorn", "uvicorn", "both"], default="both")
    parser.add_argument("--users", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument(
        "--options",
        choices=["default", "hold0", "off", "both"],
        default="both",
        help="both: default and hold0; off: OUTAGE_HOLD 0 and OUTAGE_READS False (the logouts)",
    )
    parser.add_argument("--log-dir", type=Path, default=ROOT / ".cache")
    args = parser.parse_args(argv)
    args.log_dir.mkdir(parents=True, exist_ok=True)
    servers = ["gunicorn", "uvicorn"] if args.server == "both" else [args.server]
    options = ["default", "hold0"] if args.options == "both" else [args.options]
    load = os.getloadavg()
    print(f"load average {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}, {os.cpu_count()} CPUs")
    failed = False
    for server in servers:
        for n in range(args.rounds):
            for option in options:
                r = one_round(server, option, args.users, args.log_dir)
                print(f"round {n + 1}: {describe(r)}", flush=True)
                if option == "default" and (r.tally.failures or r.tally.logouts):
                    failed = True
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
