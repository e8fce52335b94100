"""Helpers shared by the operations tests and their conftest (a module of its own, because
``conftest`` is ambiguous as a module name when several test directories have one)."""

from __future__ import annotations

import socket
from collections.abc import Callable
from io import StringIO
from typing import Any

from django.core.management import call_command

from sentinel_cache.django.checks import BACKEND
from sentinel_cache.testing import LocalSentinelCluster

# This directory's caches use a database of their own, so their pools are never the shared core
# of another directory's tests (equal configurations share one core) and closing them is safe.
OPS_DB = 7

UseCaches = Callable[..., None]


def hostport(address: tuple[str, int]) -> str:
    return f"{address[0]}:{address[1]}"


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def sentinel_cache(
    sentinels: Any, masters: Any = ("shard0", "shard1"), **options: Any
) -> dict[str, Any]:
    """One ``CACHES`` entry for this library's backend."""
    return {
        "BACKEND": BACKEND,
        "LOCATION": sentinels,
        "OPTIONS": {"MASTERS": list(masters), "DB": OPS_DB, **options},
    }


def cluster_cache(cluster: LocalSentinelCluster, **options: Any) -> dict[str, Any]:
    """A ``CACHES`` entry pointing at ``cluster``."""
    config = cluster.config()
    if config["password"]:
        options.setdefault("PASSWORD", config["password"])
    if config["sentinel_password"]:
        options.setdefault("SENTINEL_PASSWORD", config["sentinel_password"])
    return sentinel_cache(config["sentinels"], config["masters"], **options)


def status(*args: str) -> tuple[int, str]:
    """``manage.py sentinel_status`` with ``args``: its exit status and what it printed."""
    out = StringIO()
    try:
        call_command("sentinel_status", *args, stdout=out)
    except SystemExit as exc:
        return int(exc.code or 0), out.getvalue()
    return 0, out.getvalue()
