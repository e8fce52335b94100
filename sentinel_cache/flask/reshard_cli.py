"""``flask sentinel-reshard``: move the keys whose owner changed in a resharding.

The twin of ``manage.py sentinel_reshard``, with the same flags: run it once the new masters are
deployed with ``PREVIOUS_MASTERS`` in ``CACHE_OPTIONS``. ``--dry-run`` only counts what would
move. Exit code 0 done, 1 finished with errors (a shard was given up: run it again), 3 a
configuration or usage error (nothing was moved), as ``flask sentinel-status``.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import click
from flask import Flask

from sentinel_cache.core.admin import reshard
from sentinel_cache.core.topology.sharded_pool import ShardedSentinelPool
from sentinel_cache.flask.cli import (
    CACHE_TYPE,
    StatusCommand,
    config_error,
    current_or_loaded_app,
    sentinel_backends,
)

COMMAND_NAME = "sentinel-reshard"
EXIT_ERRORS = 1


def _cores(app: Flask, prefix: str | None) -> list[tuple[str, ShardedSentinelPool]]:
    """(title, core) of each core with PREVIOUS_MASTERS (caches with equal settings share one)."""
    backends = sentinel_backends(app)
    if not backends:
        config_error(f"this app has no cache of type {CACHE_TYPE}")
    if prefix is not None:
        backends = [b for b in backends if b._get_prefix() == prefix]
        if not backends:
            known = ", ".join(repr(b._get_prefix()) for b in sentinel_backends(app))
            config_error(f"no cache of type {CACHE_TYPE} has the key prefix {prefix!r} ({known})")
    found: dict[int, tuple[str, ShardedSentinelPool]] = {}
    for backend in backends:
        core = backend.core
        if core.previous_ring is not None and id(core) not in found:
            found[id(core)] = (f"cache with prefix {backend._get_prefix()!r}", core)
    if not found:
        config_error(
            "no cache has PREVIOUS_MASTERS in CACHE_OPTIONS: deploy the new masters with "
            "PREVIOUS_MASTERS naming the placement before the change, then run this"
        )
    return list(found.values())


def _emit(documents: list[dict[str, Any]]) -> None:
    """One core: its document; several: a list of them (as ``flask sentinel-status``)."""
    data: Any = documents[0] if len(documents) == 1 else documents
    click.echo(json.dumps(data, indent=2))


@click.command(COMMAND_NAME, cls=StatusCommand)
@click.option(
    "--cache",
    "prefix",
    metavar="PREFIX",
    help="Only the cache with this key prefix (when the app has several).",
)
@click.option(
    "--dry-run",
    is_flag=True,
    help="Move nothing: count what would move, per master pair, and warn about changes that "
    "move far more than needed.",
)
@click.option(
    "--rate",
    type=click.FloatRange(min=0, min_open=True),
    metavar="KEYS_PER_SECOND",
    help="Move at most this many keys a second (default: as fast as the servers go).",
)
@click.option(
    "--match",
    default="*",
    show_default=True,
    metavar="PATTERN",
    help="Only keys matching this SCAN pattern (default: every key of the database).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.option(
    "--sample",
    type=click.IntRange(min=1),
    metavar="KEYS",
    help="With --dry-run: scan only this many keys per shard (default: every key).",
)
@click.option(
    "--batch",
    type=click.IntRange(min=1),
    default=reshard.DEFAULT_BATCH,
    show_default=True,
    help="Keys per SCAN and per round trip.",
)
@click.option(
    "--retry-for",
    type=click.FloatRange(min=0),
    default=reshard.DEFAULT_RETRY_FOR,
    show_default=True,
    metavar="SECONDS",
    help="How long a shard may be unavailable (a failover) before it is given up.",
)
@click.pass_context
def sentinel_reshard_command(
    ctx: click.Context,
    prefix: str | None,
    dry_run: bool,
    rate: float | None,
    match: str,
    as_json: bool,
    sample: int | None,
    batch: int,
    retry_for: float,
) -> None:
    """Move the keys whose owner changed (masters with PREVIOUS_MASTERS) to their new owner.

    Exit code 0: done; 1: finished with errors (run it again); 3: configuration error.
    """
    if sample is not None and not dry_run:
        config_error("--sample needs --dry-run")
    cores = _cores(current_or_loaded_app(ctx), prefix)
    if dry_run:
        plans = [
            (title, reshard.plan(core, match=match, sample=sample, retry_for=retry_for))
            for title, core in cores
        ]
        if as_json:
            _emit([p.to_dict() for _, p in plans])
        else:
            for n, (title, p) in enumerate(plans):
                text = reshard.render_plan(p, title=title if len(plans) > 1 else None)
                click.echo(("\n" if n else "") + text, nl=False)
        if not all(p.complete for _, p in plans):
            raise click.exceptions.Exit(EXIT_ERRORS)
        return
    reports = []
    for title, core in cores:
        printer = None
        if not as_json:
            printer = reshard.ProgressPrinter(
                lambda text: click.echo(text, err=True, nl=False), tty=sys.stderr.isatty()
            )
            if len(cores) > 1:
                click.echo(f"{title}: migrating", err=True)
        try:
            report = reshard.migrate(
                core, match=match, rate=rate, batch=batch, progress=printer, retry_for=retry_for
            )
        except KeyboardInterrupt:
            if printer is not None:
                printer.close()
            click.echo(
                "interrupted: the keys moved so far stay moved; run the command again to continue "
                "(what is left stays readable through PREVIOUS_MASTERS)",
                err=True,
            )
            raise click.exceptions.Exit(130) from None
        if printer is not None:
            printer.close()
        reports.append((title, report))
    if as_json:
        _emit([r.to_dict() for _, r in reports])
    else:
        for n, (title, r) in enumerate(reports):
            text = reshard.render_report(r, title=title if len(reports) > 1 else None)
            click.echo(("\n" if n else "") + text, nl=False)
    if not all(r.complete for _, r in reports):
        raise click.exceptions.Exit(EXIT_ERRORS)
