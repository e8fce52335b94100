"""``flask sentinel-status``: every shard's master, replicas and sentinels for an app's caches.

Exit code 0 healthy, 1 degraded (still serving), 2 a shard is unavailable, 3 a configuration or
usage error (nothing was checked), as ``manage.py sentinel_status``; ``--fail-on down`` (for
readiness probes) exits 0 while every shard can serve.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, NoReturn

import click
from flask import Flask, current_app
from flask.cli import ScriptInfo

from sentinel_cache.core.admin import status
from sentinel_cache.core.topology.sharded_pool import ShardedSentinelPool
from sentinel_cache.exceptions import ConfigurationError

if TYPE_CHECKING:
    from sentinel_cache.flask.cache import ShardedSentinelCache

CACHE_TYPE = "sentinel_cache.flask.ShardedSentinelCache"
COMMAND_NAME = "sentinel-status"


def sentinel_backends(app: Flask) -> list[ShardedSentinelCache]:
    from sentinel_cache.flask.cache import ShardedSentinelCache

    caches = getattr(app, "extensions", {}).get("cache", {})
    return [c for c in caches.values() if isinstance(c, ShardedSentinelCache)]


def config_error(message: str) -> NoReturn:
    """Exit 3 ("configuration error"), never 1 (which says "degraded")."""
    click.echo(f"Error: {message}", err=True)
    raise click.exceptions.Exit(status.EXIT_CONFIG)


class _UsageError(click.UsageError):
    exit_code = status.EXIT_CONFIG


class StatusCommand(click.Command):
    """Usage errors exit 3 like configuration errors: click's 2 would read as "down"."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        try:
            return super().parse_args(ctx, args)
        except click.UsageError as exc:
            raise _UsageError(exc.format_message(), exc.ctx) from exc


def current_or_loaded_app(ctx: click.Context) -> Flask:
    """The current app, loading it if this command runs outside one (as a plugin command
    would): settings that do not parse are a configuration error, exit 3."""
    if current_app:
        app: Flask = current_app._get_current_object()  # type: ignore[attr-defined]
        return app
    try:
        app = ctx.ensure_object(ScriptInfo).load_app()
    except ConfigurationError as exc:
        config_error(str(exc))
    ctx.with_resource(app.app_context())
    return app


@click.command(COMMAND_NAME, cls=StatusCommand)
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.option(
    "--timeout",
    type=click.FloatRange(min=0.01),
    default=status.DEFAULT_TIMEOUT,
    show_default=True,
    help="Seconds to wait for each sentinel and master.",
)
@click.option(
    "--fail-on",
    type=click.Choice(status.FAIL_ON),
    default=status.DEGRADED,
    show_default=True,
    help="Exit non-zero when degraded, or only when a shard cannot serve (down): for "
    "readiness probes, where missing redundancy is a warning.",
)
@click.pass_context
def sentinel_status_command(
    ctx: click.Context, as_json: bool, timeout: float, fail_on: str
) -> None:
    """Show every shard's master, replicas and sentinels for this app's sharded cache.

    Exit code 0: healthy; 1: degraded (still serving); 2: a shard is unavailable;
    3: configuration error.
    """
    app = current_or_loaded_app(ctx)
    # Caches with equal connection settings share one core: report each core once.
    cores: dict[int, tuple[ShardedSentinelPool, list[str]]] = {}
    for cache in sentinel_backends(app):
        entry = cores.setdefault(id(cache.core), (cache.core, []))
        entry[1].append(repr(cache._get_prefix()))
    if not cores:
        config_error(f"this app has no cache of type {CACHE_TYPE}")
    reports: list[dict[str, Any]] = [
        status.collect(core, timeout=timeout, fail_on=fail_on) for core, _ in cores.values()
    ]
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
    """Register ``flask sentinel-status`` and ``flask sentinel-reshard`` with ``app`` (done by
    :meth:`factory`; idempotent)."""
    if COMMAND_NAME not in app.cli.commands:
        app.cli.add_command(sentinel_status_command)
    from sentinel_cache.flask.reshard_cli import sentinel_reshard_command  # imports this module

    app.cli.commands.setdefault(sentinel_reshard_command.name or "", sentinel_reshard_command)
