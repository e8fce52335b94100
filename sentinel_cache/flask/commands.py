"""``flask sentinel-status`` and ``flask sentinel-reshard``: the click front end of the operator
commands declared in :mod:`sentinel_cache.core.admin.commands` (the options, their checks and the
``--watch`` loop are the same as ``manage.py sentinel_status``/``sentinel_reshard``).

``--cache PREFIX`` selects the cache with that key prefix when the app has several. Exit codes
as the Django commands: status 0 healthy, 1 degraded (still serving), 2 a shard is unavailable;
reshard 0 done, 1 finished with errors (run it again); 3 a configuration or usage error
(nothing was checked or moved).

The backend (:mod:`sentinel_cache.flask.cache`) registers these with :func:`init_app`; this
module imports nothing of the backend, so nothing imports it back. A cache is ours when its
``core`` is a :class:`ShardedSentinelPool`.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Mapping
from typing import Any, NoReturn, Protocol

import click
from flask import Flask, current_app
from flask.cli import ScriptInfo

from sentinel_cache.core.admin import commands, reshard, status
from sentinel_cache.core.admin.reshard import previous
from sentinel_cache.core.config import CacheOptions
from sentinel_cache.core.topology.sharded_pool import ShardedSentinelPool
from sentinel_cache.exceptions import ConfigurationError

__all__ = [
    "CACHE_TYPE",
    "COMMAND_NAME",
    "RESHARD_COMMAND_NAME",
    "OperatorCommand",
    "config_error",
    "current_or_loaded_app",
    "init_app",
    "options_of",
    "select_backends",
    "sentinel_backends",
    "sentinel_reshard_command",
    "sentinel_status_command",
]

CACHE_TYPE = "sentinel_cache.flask.ShardedSentinelCache"
COMMAND_NAME = commands.STATUS.flask_name
RESHARD_COMMAND_NAME = commands.RESHARD.flask_name
EXIT_ERRORS = 1


class SentinelBackend(Protocol):
    """What the commands need of a cache: its core, its options and its key prefix."""

    core: ShardedSentinelPool
    options: CacheOptions

    def resolved_prefix(self) -> str: ...


def sentinel_backends(app: Flask) -> list[SentinelBackend]:
    """The app's caches whose core is a sharded Sentinel pool, in the order they were made."""
    caches = getattr(app, "extensions", {}).get("cache", {})
    return [c for c in caches.values() if isinstance(getattr(c, "core", None), ShardedSentinelPool)]


def config_error(message: str) -> NoReturn:
    """Exit 3 ("configuration error"), never 1 (which says "degraded")."""
    click.echo(f"Error: {message}", err=True)
    raise click.exceptions.Exit(status.EXIT_CONFIG)


class _UsageError(click.UsageError):
    exit_code = status.EXIT_CONFIG


class OperatorCommand(click.Command):
    """Usage errors exit 3 like configuration errors: click's 2 would read as "down"."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        try:
            return super().parse_args(ctx, args)
        except click.UsageError as exc:
            raise _UsageError(exc.format_message(), exc.ctx) from exc


class _Checked(click.ParamType):
    """A value parsed as the table says and refused by the table's check, so click names the
    option: ``Invalid value for '--rate': must be a positive number ...``."""

    def __init__(self, option: commands.Option) -> None:
        self.option = option
        self.name = option.type.__name__

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if not isinstance(value, str):
            parsed = value  # a default, or the bare option's value
        else:
            try:
                parsed = self.option.type(value)
            except ValueError:
                self.fail(f"{value!r} is not a valid {self.name}", param, ctx)
        reason = self.option.reason(parsed)
        if reason is not None:
            self.fail(f"{reason} (got {parsed!r})", param, ctx)
        return parsed


def options_of(spec: commands.Command) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """A decorator adding every option of ``spec`` to a click command, as the table says."""

    def decorate(function: Callable[..., Any]) -> Callable[..., Any]:
        for option in reversed(spec.options):
            kwargs: dict[str, Any] = {"help": option.help, "hidden": option.hidden}
            if option.type is bool:
                function = click.option(
                    option.flag, option.dest, is_flag=True, default=option.default, **kwargs
                )(function)
                continue
            if option.choices:
                kwargs["type"] = click.Choice(option.choices)
            else:
                kwargs["type"] = _Checked(option)
                kwargs["metavar"] = option.metavar
            if option.const is not None:
                kwargs.update(is_flag=False, flag_value=option.const)
            function = click.option(
                option.flag,
                option.dest,
                default=option.default,
                show_default=option.default is not None,
                **kwargs,
            )(function)
        return function

    return decorate


def refuse_bad_values(spec: commands.Command, values: Mapping[str, Any]) -> None:
    """What click cannot check alone (an option that needs another): exit 3, naming it."""
    refused = spec.refusals(values)
    if refused:
        config_error(refused[0])


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


def select_backends(app: Flask, prefix: str | None) -> list[SentinelBackend]:
    """The app's sentinel caches, or only the one with key prefix ``prefix``; exit 3 if none."""
    backends = sentinel_backends(app)
    if not backends:
        config_error(f"this app has no cache of type {CACHE_TYPE}")
    if prefix is None:
        return backends
    chosen = [b for b in backends if b.resolved_prefix() == prefix]
    if not chosen:
        known = ", ".join(repr(b.resolved_prefix()) for b in backends)
        config_error(f"no cache of type {CACHE_TYPE} has the key prefix {prefix!r} ({known})")
    return chosen


# -- sentinel-status ---------------------------------------------------------------------------


@click.command(COMMAND_NAME, cls=OperatorCommand, help=commands.STATUS.help)
@options_of(commands.STATUS)
@click.pass_context
def sentinel_status_command(ctx: click.Context, **values: Any) -> None:
    refuse_bad_values(commands.STATUS, values)
    app = current_or_loaded_app(ctx)
    # Caches with equal connection settings share one core: report each core once.
    cores: dict[int, tuple[ShardedSentinelPool, list[str]]] = {}
    for cache in select_backends(app, values["cache"]):
        entry = cores.setdefault(id(cache.core), (cache.core, []))
        entry[1].append(repr(cache.resolved_prefix()))

    def show(stream: bool = False) -> int:
        reports: list[dict[str, Any]] = [
            status.collect(core, timeout=values["timeout"], fail_on=values["fail_on"])
            for core, _ in cores.values()
        ]
        if values["json"]:
            # One core (the usual case): its report; several: a list of them, in config order.
            # In --watch mode one compact document per line, so the stream pipes into jq.
            data: Any = reports[0] if len(reports) == 1 else reports
            click.echo(json.dumps(data, indent=None if stream else 2, default=str))
        else:
            for n, (report, (_, prefixes)) in enumerate(zip(reports, cores.values(), strict=True)):
                title = f"cache with prefix {', '.join(prefixes)}" if len(reports) > 1 else None
                click.echo(("\n" if n else "") + status.render_text(report, title=title), nl=False)
        return max(status.exit_code(report) for report in reports)

    interval = values["watch"]
    if interval is None:
        code = show()
    else:
        text = not values["json"]
        code = commands.watch(
            lambda: show(stream=True),
            interval,
            iterations=values["iterations"],
            before=lambda: click.echo(commands.CLEAR_SCREEN, nl=False) if text else None,
            after=lambda code: (
                click.echo(f"refreshing every {interval:g}s; Ctrl-C to stop (exit code {code})")
                if text
                else None
            ),
            stopped=lambda: click.echo(""),
        )
    if code:
        raise click.exceptions.Exit(code)


# -- sentinel-reshard --------------------------------------------------------------------------


def _cores(app: Flask, prefix: str | None) -> list[tuple[str, ShardedSentinelPool]]:
    """(title, core) of each core with PREVIOUS_MASTERS (caches with equal settings share one)."""
    found: dict[int, tuple[str, ShardedSentinelPool]] = {}
    for backend in select_backends(app, prefix):
        core = backend.core
        if core.previous_ring is not None and id(core) not in found:
            found[id(core)] = (f"cache with prefix {backend.resolved_prefix()!r}", core)
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


@click.command(RESHARD_COMMAND_NAME, cls=OperatorCommand, help=commands.RESHARD.help)
@options_of(commands.RESHARD)
@click.pass_context
def sentinel_reshard_command(ctx: click.Context, **values: Any) -> None:
    refuse_bad_values(commands.RESHARD, values)
    if values["from_previous"]:
        _from_previous(current_or_loaded_app(ctx), values)
        return
    cores = _cores(current_or_loaded_app(ctx), values["cache"])
    match, retry_for = values["match"], values["retry_for"]
    if values["dry_run"]:
        plans = [
            (title, reshard.plan(core, match=match, sample=values["sample"], retry_for=retry_for))
            for title, core in cores
        ]
        if values["json"]:
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
        if not values["json"]:
            printer = reshard.ProgressPrinter(
                lambda text: click.echo(text, err=True, nl=False), tty=sys.stderr.isatty()
            )
            if len(cores) > 1:
                click.echo(f"{title}: migrating", err=True)
        try:
            report = reshard.migrate(
                core,
                match=match,
                rate=values["rate"],
                batch=values["batch"],
                progress=printer,
                retry_for=retry_for,
                **reshard.durability(
                    b.options
                    for b in sentinel_backends(current_or_loaded_app(ctx))
                    if b.core is core
                ),
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
    if values["json"]:
        _emit([r.to_dict() for _, r in reports])
    else:
        for n, (title, r) in enumerate(reports):
            text = reshard.render_report(r, title=title if len(reports) > 1 else None)
            click.echo(("\n" if n else "") + text, nl=False)
    if not all(r.complete for _, r in reports):
        raise click.exceptions.Exit(EXIT_ERRORS)


def _from_previous(app: Flask, values: Mapping[str, Any]) -> None:
    """``--from-previous-cache``: every key of each cache's PREVIOUS_CACHE adopted (or counted)."""
    adopting = [
        (backend.resolved_prefix(), *backend.adoption())
        for backend in select_backends(app, values["cache"])
        if hasattr(backend, "adoption")
    ]
    if not adopting:
        config_error(
            "no cache has PREVIOUS_CACHE in CACHE_OPTIONS: set it to the Flask-Caching "
            "configuration being replaced, deploy, then run this"
        )

    def progress(title: str) -> reshard.ProgressPrinter | None:
        if values["json"]:
            return None
        click.echo(f"{title}: migrating", err=True)
        return reshard.ProgressPrinter(
            lambda text: click.echo(text, err=True, nl=False), tty=sys.stderr.isatty()
        )

    try:
        documents, texts, complete = previous.run_previous(
            adopting,
            dry_run=values["dry_run"],
            rate=values["rate"],
            batch=values["batch"],
            sample=values["sample"],
            progress=progress,
        )
    except ConfigurationError as exc:
        config_error(str(exc))
    except KeyboardInterrupt:
        click.echo(
            "interrupted: the keys moved so far stay moved; run the command again to continue "
            "(what is left stays readable through PREVIOUS_CACHE)",
            err=True,
        )
        raise click.exceptions.Exit(130) from None
    if values["json"]:
        _emit(list(documents.values()))
    else:
        click.echo("\n".join(texts), nl=False)
    if not complete:
        raise click.exceptions.Exit(EXIT_ERRORS)


def init_app(app: Flask) -> None:
    """Register ``flask sentinel-status`` and ``flask sentinel-reshard`` with ``app`` (done by
    the backend's factory; idempotent)."""
    for command in (sentinel_status_command, sentinel_reshard_command):
        app.cli.commands.setdefault(command.name or "", command)
