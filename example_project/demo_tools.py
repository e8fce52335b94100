"""What every step of ``make demo`` uses (:mod:`example_project.demo` and its sibling step
modules): the progress output, a tiny browser, background traffic, the login form, and Django's
management commands run in this process."""

from __future__ import annotations

import http.cookiejar
import io
import json
import re
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from typing import Any

USERNAME = "demo"
PASSWORD = "sharded-sentinel-demo"  # a throwaway account on a throwaway sqlite database


class DemoFailure(Exception):
    """A step did not do what it should; the message says what and why."""


class Output:
    """Progress lines with the time since the start."""

    def __init__(self, stream: Any = None) -> None:
        self.stream = stream or sys.stdout
        self.began = time.monotonic()
        self.steps = 0

    def elapsed(self) -> float:
        return time.monotonic() - self.began

    def step(self, title: str) -> None:
        self.steps += 1
        self.line(f"\n== {self.steps}. {title}  [{self.elapsed():5.1f}s]")

    def line(self, text: str = "") -> None:
        print(text, file=self.stream, flush=True)

    def say(self, text: str) -> None:
        self.line(f"   {text}")

    def block(self, text: str) -> None:
        for row in text.rstrip("\n").splitlines():
            self.line(f"   | {row}")


# -- a tiny HTTP client (urllib with cookies) ---------------------------------------------------


class Browser:
    """One user agent: a cookie jar and a base URL; returns (status, body) and never raises on
    an HTTP error status."""

    def __init__(self, base: str, timeout: float = 10.0) -> None:
        self.base = base
        self.timeout = timeout
        self.jar = http.cookiejar.CookieJar()
        self.opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(self.jar))

    def request(self, path: str, data: dict[str, str] | None = None) -> tuple[int, bytes]:
        body = None if data is None else urllib.parse.urlencode(data).encode()
        req = urllib.request.Request(self.base + path, data=body)
        try:
            with self.opener.open(req, timeout=self.timeout) as response:
                return response.status, response.read()
        except urllib.error.HTTPError as exc:
            with exc:
                return exc.code, exc.read()

    def json(self, path: str) -> Any:
        status, body = self.request(path)
        if status != 200:
            raise DemoFailure(f"GET {path} answered {status}: {body[:300]!r}")
        return json.loads(body)

    def cookie(self, name: str) -> str | None:
        return next((c.value for c in self.jar if c.name == name), None)


class Traffic(threading.Thread):
    """Sends requests back to back until stopped; counts successes, failures and latencies."""

    def __init__(self, name: str, send: Callable[[int], str | None]) -> None:
        super().__init__(name=f"demo-traffic-{name}", daemon=True)
        self.label = name
        self.send = send  # returns None when the request succeeded, else why it failed
        self.halt = threading.Event()
        self.ok = 0
        self.failures: list[str] = []
        self.slowest = 0.0
        self.acked: list[int] = []

    def run(self) -> None:
        n = 0
        while not self.halt.is_set():
            n += 1
            started = time.monotonic()
            try:
                problem = self.send(n)
            except Exception as exc:  # a dropped connection is a failed request too
                problem = f"{type(exc).__name__}: {exc}"
            self.slowest = max(self.slowest, time.monotonic() - started)
            if problem is None:
                self.ok += 1
                self.acked.append(n)
            else:
                self.failures.append(problem)

    def stop(self) -> None:
        self.halt.set()
        self.join(15)

    @property
    def total(self) -> int:
        return self.ok + len(self.failures)


class ProgressStream(io.TextIOBase):
    """Where ``sentinel_reshard`` writes its progress: the demo's output, indented like a block,
    live. On a terminal it says so, and the command draws its bar (redrawn with ``\\r``); on
    anything else the command prints plain progress lines."""

    def __init__(self, out: Output) -> None:
        super().__init__()
        self.out = out
        self.tty = bool(getattr(out.stream, "isatty", lambda: False)())
        self.fresh = True
        self.text: list[str] = []

    def isatty(self) -> bool:
        return self.tty

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        self.text.append(text)
        for piece in re.split(r"([\r\n])", text):
            if piece in ("\r", "\n"):
                self.out.stream.write(piece)
                self.fresh = True
            elif piece:
                if self.fresh:
                    self.out.stream.write("   | ")
                    self.fresh = False
                self.out.stream.write(piece)
        self.out.stream.flush()
        return len(text)


def wait_for(condition: Callable[[], bool], timeout: float, what: str) -> float:
    """Poll ``condition`` until it holds; returns the seconds it took, DemoFailure after
    ``timeout``."""
    started = time.monotonic()
    while not condition():
        if time.monotonic() - started > timeout:
            raise DemoFailure(f"no {what} after {timeout:g}s")
        time.sleep(0.005)
    return time.monotonic() - started


def log_in(browser: Browser, username: str) -> dict[str, Any]:
    """The login form, as a person fills it in; returns ``/api/me/`` afterwards."""
    status, body = browser.request("/accounts/login/")
    token = re.search(rb'name="csrfmiddlewaretoken" value="([^"]+)"', body)
    if status != 200 or token is None:
        raise DemoFailure(f"the login page answered {status} without a CSRF token")
    status, body = browser.request(
        "/accounts/login/",
        {
            "username": username,
            "password": PASSWORD,
            "csrfmiddlewaretoken": token.group(1).decode(),
        },
    )
    if status != 200 or f"Hello {username}".encode() not in body:
        raise DemoFailure(f"{username}'s login did not land on the account page ({status})")
    me: dict[str, Any] = browser.json("/api/me/")
    if not me["authenticated"] or me["username"] != username:
        raise DemoFailure(f"{username} logged in, but /api/me/ says {me['username']!r}")
    return me


def logged_in_users(base: str, prefix: str, count: int) -> list[tuple[str, Browser]]:
    """``count`` users ``<prefix>00``, ... made (or their password reset) and each logged in
    through the login form in a browser of its own."""
    from example_project.server import ensure_user

    users: list[tuple[str, Browser]] = []
    for n in range(count):
        name = f"{prefix}{n:02d}"
        ensure_user(name, PASSWORD)
        browser = Browser(base)
        log_in(browser, name)
        users.append((name, browser))
    return users


def sentinel_status(alias: str = "default") -> tuple[str, int]:
    """``call_command("sentinel_status", "--cache", alias)``; returns (its text, exit code)."""
    from django.core.management import call_command

    buffer = io.StringIO()
    try:
        call_command("sentinel_status", "--cache", alias, stdout=buffer)
        code = 0
    except SystemExit as exc:  # 1 degraded, 2 down
        code = int(exc.code or 0)
    return buffer.getvalue(), code


def command(*args: str, stderr: Any = None) -> tuple[int, str, str]:
    """``call_command(*args)``; returns (exit code, stdout, stderr)."""
    from django.core.management import call_command

    out = io.StringIO()
    err = stderr if stderr is not None else io.StringIO()
    try:
        call_command(*args, stdout=out, stderr=err)
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    return code, out.getvalue(), err.getvalue() if isinstance(err, io.StringIO) else ""
