"""Every limit, default and interval the docs state in prose is the code's constant.

Each row names a page, the sentence (white space folded) with the figure as written, and the
constant it states; the test fails if the page no longer says it or the code changed the value.
(Defaults of the options are in the tables of docs/configuration.md: tests/test_docs.py.)
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from sentinel_cache.core.admin import commands
from sentinel_cache.core.admin.health.check import RESTART_WARNING_SECONDS
from sentinel_cache.core.admin.health.probe import PROBE_TTL_MS
from sentinel_cache.core.admin.reshard.migration import DEFAULT_DELETE_DELAY
from sentinel_cache.core.admin.states import HEALTH_TIMEOUT
from sentinel_cache.core.arguments import MAX_TIMEOUT
from sentinel_cache.core.config import MAX_CONNECTIONS_LIMIT, PoolConfig
from sentinel_cache.core.ops._sync.stampede import (
    FIRST_WAIT,
    LONGEST_BLOCK,
    LONGEST_WAIT,
    TIMER_SLACK_MS,
    WAKE_MS,
)
from sentinel_cache.core.ops.scripts import CLOCK_MARGIN_MS, TOMBSTONE_MS
from sentinel_cache.core.ring import NODES_PER_WEIGHT
from sentinel_cache.core.topology.discovery import CONFLICT_LOG_INTERVAL
from sentinel_cache.core.topology.housekeeping import CHECK_TIMEOUT
from sentinel_cache.core.topology.lean_rules import (
    DEFAULT_BULK_LIMIT,
    MAX_REPLY_ELEMENTS,
    MIN_BULK_LIMIT,
)
from sentinel_cache.core.topology.listener import CHANNELS
from sentinel_cache.core.topology.near import WRITER_WAIT
from sentinel_cache.core.topology.sentinels import IDLE_SOCKET_SECONDS, MAX_SENTINELS
from sentinel_cache.core.topology.shard import STALE_FENCE_SECONDS
from sentinel_cache.django.checks import DEPLOY_PING_TIMEOUT, MIN_SENTINELS

DOCS = Path(__file__).resolve().parent.parent / "docs"
RERESOLVE_INTERVAL = PoolConfig.create(["shard_a"], ["127.0.0.1:26379"]).reresolve_interval


def _flag_default(command: Any, flag: str) -> Any:
    """A command option's default as its --help shows it (``--watch``: its bare value)."""
    option = next(o for o in command.options if o.flag == flag)
    return option.default if option.default is not None else option.const


# (page, sentence with one "{}" where the figure stands, the figure as the page writes it, value)
STATED: list[tuple[str, str, str, float]] = [
    ("configuration.md", "{} virtual nodes per unit", "160", NODES_PER_WEIGHT),
    ("configuration.md", "`MAX_TIMEOUT` = {} s", "9,000,000,000,000,000", MAX_TIMEOUT),
    ("configuration.md", "more than {} (`max_connections:", "10000", MAX_CONNECTIONS_LIMIT),
    ("configuration.md", "used too, up to {} sentinels in all", "16", MAX_SENTINELS),
    (
        "operations.md",
        "per-probe timeout (default {} s)",
        "1",
        _flag_default(commands.STATUS, "--timeout"),
    ),
    (
        "operations.md",
        "(every {} s when given bare)",
        "2",
        _flag_default(commands.STATUS, "--watch"),
    ),
    ("operations.md", "`RESTART_WARNING_SECONDS`, {} s", "300", RESTART_WARNING_SECONDS),
    ("operations.md", "fewer than {} sentinels configured", "3", MIN_SENTINELS),
    ("operations.md", "do not answer ({} s timeouts, all at once)", "0.4", DEPLOY_PING_TIMEOUT),
    ("operations.md", "closed after {} s without one", "10", IDLE_SOCKET_SECONDS),
    ("operations.md", "subscribed to {} event channels", "16", len(CHANNELS)),
    ("observability.md", "**The budget** is {} seconds", "0.5", HEALTH_TIMEOUT),
    ("observability.md", "a unique token and a {}-second expiry", "10", PROBE_TTL_MS / 1000),
    (
        "resharding.md",
        "(`--batch`, default {} keys)",
        "500",
        _flag_default(commands.RESHARD, "--batch"),
    ),
    (
        "resharding.md",
        "`--retry-for` seconds (default {})",
        "30",
        _flag_default(commands.RESHARD, "--retry-for"),
    ),
    ("resharding.md", "the delete comes {} s after the restore", "0.2", DEFAULT_DELETE_DELAY),
    (
        "resharding.md",
        "(a restore more than {} s late)",
        "9",
        (TOMBSTONE_MS - CLOCK_MARGIN_MS) / 1000,
    ),
    ("failover.md", "is lifted after {} seconds", "5", STALE_FENCE_SECONDS),
    ("failover.md", "`RERESOLVE_INTERVAL` ({} s) per shard", "0.2", RERESOLVE_INTERVAL),
    ("failover.md", "(once per {} s per master and node)", "10", CONFLICT_LOG_INTERVAL),
    ("failover.md", "about once a second (with a {} s timeout)", "0.5", CHECK_TIMEOUT),
    ("near-cache.md", "`WRITER_WAIT` ({} ms)", "10", WRITER_WAIT * 1000),
    ("stampede.md", "it expires {} s after the lock's end", "1", WAKE_MS / 1000),
    ("stampede.md", "A block lasts at most {} s, half the socket", "1", LONGEST_BLOCK),
    ("stampede.md", "the lock's time left less {} ms", "100", TIMER_SLACK_MS),
    ("stampede.md", "poll the lock and the value every {} to 50 ms", "5", FIRST_WAIT * 1000),
    ("stampede.md", "poll the lock and the value every 5 to {} ms", "50", LONGEST_WAIT * 1000),
    ("migration.md", "mark every shard cleared for {} s", "10", TOMBSTONE_MS / 1000),
    (
        "reliability.md",
        "of more than {} elements (`MAX_REPLY_ELEMENTS`)",
        "16,777,216",
        MAX_REPLY_ELEMENTS,
    ),
    ("reliability.md", "({} MiB unless it allows more)", "512", DEFAULT_BULK_LIMIT / 2**20),
    ("reliability.md", "where `CONFIG` is refused, {} MiB)", "512", DEFAULT_BULK_LIMIT / 2**20),
    ("reliability.md", "larger than {} MiB (the smallest limit", "1", MIN_BULK_LIMIT / 2**20),
    ("security.md", "the server's default, {} MiB, is assumed", "512", DEFAULT_BULK_LIMIT / 2**20),
]


def folded(page: str) -> str:
    return " ".join((DOCS / page).read_text(encoding="utf-8").split())


@pytest.mark.parametrize(
    ("page", "sentence", "written", "value"), STATED, ids=[f"{r[0]}:{r[2]}" for r in STATED]
)
def test_the_page_states_the_code_constant(
    page: str, sentence: str, written: str, value: float
) -> None:
    text = folded(page)
    assert sentence.format(written) in text, f"{page} no longer says {sentence.format(written)!r}"
    assert float(written.replace(",", "")) == pytest.approx(value, rel=1e-12), (
        f"{page} says {written}, the code has {value}"
    )


def test_the_listener_table_names_every_channel_subscribed() -> None:
    """docs/failover.md's table of what a listener subscribes to, ``-failover-abort-*`` read as
    every channel so named, is the listener's ``CHANNELS``."""
    text = (DOCS / "failover.md").read_text(encoding="utf-8")
    table = text[text.index("| Channel | What the listener does |") :].split("\n\n", 1)[0]
    named: set[str] = set()
    for row in table.splitlines()[2:]:
        named.update(re.findall(r"`([+-][a-z*-]+)`", row.split(" | ")[0]))
    aborts = {c for c in CHANNELS if c.startswith("-failover-abort-")}
    if "-failover-abort-*" in named:
        named = (named - {"-failover-abort-*"}) | aborts
    assert sorted(named) == sorted(CHANNELS)


def test_the_extras_table_is_the_packages_extras() -> None:
    """docs/install.md's table of extras names each extra of pyproject.toml (but ``dev``, the
    contributors' own), and the package each installs."""
    pyproject = (DOCS.parent / "pyproject.toml").read_text(encoding="utf-8")
    section = pyproject.split("[project.optional-dependencies]", 1)[1].split("\n[", 1)[0]
    extras = {
        name: re.findall(r'"([A-Za-z0-9_.-]+)', packages)[0]
        for name, packages in re.findall(r"^(\w+) = \[([^\]]*)", section, re.M)
        if name != "dev"
    }
    install = (DOCS / "install.md").read_text(encoding="utf-8")
    rows = dict(re.findall(r"^\| `(\w+)` \| ([^|]+) \|", install, re.M))
    assert sorted(rows) == sorted(extras)
    wrong = [
        f"{e}: {rows[e]!r} vs {p}" for e, p in extras.items() if p.lower() not in rows[e].lower()
    ]
    assert wrong == []
