"""``flask sentinel-status``: every shard's master, replicas and sentinels for an app's caches."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import click
from flask import Flask, current_app
from flask.cli import with_appcontext

from sentinel_cache.core import status
from sentinel_cache.core.sharded_pool import ShardedSentinelPool

if TYPE_CHECKING:
    from sentinel_cache.flask.cache import ShardedSentinelCache

CACHE_TYPE = "sentinel_cache.flask.ShardedSentinelCache"
COMMAND_NAME = "sentinel-status"


def _backends(app: Flask) -> list[ShardedSentinelCache]:
    from sentinel_cache.flask.cache import ShardedSentinelCache

    caches = getattr(app, "extensions", {}).get("cache", {})
    return [c for c in caches.values() if isinstance(c, ShardedSentinelCache)]


@click.command(COMMAND_NAME)
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.option(
    "--timeout",
    type=click.FloatRange(min=0.01),
    default=1.0,
    show_default=True,
    help="Seconds to wait for each sentinel and master.",
)
@with_appcontext
def sentinel_status_command(as_json: bool, timeout: float) -> None:
    """Show every shard's master, replicas and sentinels for this app's sharded cache.

    Exit code 0: healthy; 1: degraded (still serving); 2: a shard is unavailable.
    """
    # Caches with equal connection settings share one core: report each core once.
    cores: dict[int, tuple[ShardedSentinelPool, list[str]]] = {}
    for cache in _backends(current_app):
        entry = cores.setdefault(id(cache.core), (cache.core, []))
        entry[1].append(repr(cache._get_prefix()))
    if not cores:
        raise click.UsageError(f"this app has no cache of type {CACHE_TYPE}")
    reports = [status.collect(core, timeout=timeout) for core, _ in cores.values()]
    if as_json:
        # One core (the usual case): its report; several: a list of them, in config order.
        if len(reports) == 1:
            click.echo(status.render_json(reports[0]))
        else:
            click.echo(json.dumps(reports, indent=2, default=str))
    else:
        for n, (report, (_, prefixes)) in enumerate(zip(reports, cores.values(), strict=True)):
            title = f"cache with prefix {', '.join(prefixes)}" if len(reports) > 1 else None
            click.echo(("\n" if n else "") + status.render_text(report, title=title), nl=False)
    code = max(status.exit_code(report) for report in reports)
    if code:
        raise click.exceptions.Exit(code)


def init_app(app: Flask) -> None:
    """Register ``flask sentinel-status`` with ``app`` (done by :meth:`factory`; idempotent)."""
    if COMMAND_NAME not in app.cli.commands:
        app.cli.add_command(sentinel_status_command)
