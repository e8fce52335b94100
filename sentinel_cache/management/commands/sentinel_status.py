"""``manage.py sentinel_status``: the live state of every sharded Sentinel cache, for operators.

Exit code 0 healthy, 1 degraded (still serving), 2 down (a shard has no reachable master), 3 a
configuration or usage error (nothing was checked), so a probe or a deploy script can branch on
it; with several caches, the worst one wins. ``--fail-on down`` (for readiness probes) exits 0
while every shard can serve, whatever redundancy is missing (printed as warnings).
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any, NoReturn

from django.conf import settings
from django.core.cache import caches
from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError, CommandParser

from sentinel_cache.core import status
from sentinel_cache.core.sharded_pool import ShardedSentinelPool
from sentinel_cache.django.checks import BACKEND, sentinel_aliases
from sentinel_cache.exceptions import ConfigurationError

CLEAR_SCREEN = "\033[H\033[2J"
DEFAULT_WATCH_SECONDS = 2.0


class Command(BaseCommand):
    help = (
        "Show every shard's master, replicas, sentinels and failover readiness for the caches "
        f"using {BACKEND}. Exit code: 0 healthy, 1 degraded, 2 down, 3 configuration error."
    )
    # An operator's tool must run while something else in the project fails its checks.
    requires_system_checks: list[str] = []

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--cache", metavar="ALIAS", help="Only this cache alias (default: every one using it)."
        )
        parser.add_argument("--json", action="store_true", help="Print JSON keyed by alias.")
        parser.add_argument(
            "--watch",
            nargs="?",
            type=float,
            const=DEFAULT_WATCH_SECONDS,
            metavar="SECONDS",
            help=f"Refresh every SECONDS (default {DEFAULT_WATCH_SECONDS:g}) until Ctrl-C.",
        )
        parser.add_argument(
            "--timeout",
            type=float,
            default=status.DEFAULT_TIMEOUT,
            metavar="SECONDS",
            help="Timeout of every probe (default %(default)s).",
        )
        parser.add_argument(
            "--fail-on",
            choices=status.FAIL_ON,
            default=status.DEGRADED,
            help="Exit non-zero when degraded (the default), or only when a shard cannot serve "
            "(down): for readiness probes, where missing redundancy is a warning.",
        )
        # Bounds --watch, for tests.
        parser.add_argument("--iterations", type=int, help=argparse.SUPPRESS)

    def create_parser(self, prog_name: str, subcommand: str, **kwargs: Any) -> CommandParser:
        """Usage errors exit 3, like configuration errors: argparse's 2 would read as "down"."""
        parser = super().create_parser(prog_name, subcommand, **kwargs)

        def error(message: str) -> NoReturn:
            if parser.called_from_command_line:
                parser.print_usage(sys.stderr)
                parser.exit(status.EXIT_CONFIG, f"{parser.prog}: error: {message}\n")
            raise _config_error(f"Error: {message}")

        parser.error = error  # type: ignore[method-assign]
        return parser

    def handle(self, *args: Any, **options: Any) -> None:
        timeout = options["timeout"]
        watch = options["watch"]
        if timeout is None or timeout <= 0:
            raise _config_error(f"--timeout must be a positive number of seconds (got {timeout})")
        if watch is not None and watch <= 0:
            raise _config_error(f"--watch must be a positive number of seconds (got {watch})")
        cores = {alias: self._core(alias) for alias in self._aliases(options["cache"])}
        if watch is None:
            code = self._show(cores, options, timeout)
        else:
            code = self._watch(cores, options, timeout, watch, options["iterations"])
        if code:
            raise SystemExit(code)

    def _aliases(self, alias: str | None) -> list[str]:
        ours = sentinel_aliases()
        if alias is None:
            if not ours:
                raise _config_error(f"no cache in settings.CACHES uses {BACKEND}")
            return list(ours)
        configured = getattr(settings, "CACHES", {})
        if alias not in configured:
            known = ", ".join(sorted(configured)) or "none"
            raise _config_error(f"unknown cache alias {alias!r} (settings.CACHES has: {known})")
        if alias not in ours:
            backend = configured[alias].get("BACKEND")
            raise _config_error(f"cache {alias!r} uses {backend}, not {BACKEND}")
        return [alias]

    def _core(self, alias: str) -> ShardedSentinelPool:
        try:
            return caches[alias].core  # type: ignore[attr-defined]
        except (ConfigurationError, ImproperlyConfigured) as exc:  # the backend's, or Django's
            raise _config_error(f"cache {alias!r}: {exc}") from exc

    def _show(
        self,
        cores: dict[str, ShardedSentinelPool],
        options: dict[str, Any],
        timeout: float,
        *,
        stream: bool = False,
    ) -> int:
        """Print one report per alias; returns the worst exit code."""
        reports = {
            alias: status.collect(core, timeout=timeout, fail_on=options["fail_on"])
            for alias, core in cores.items()
        }
        if options["json"]:
            # In --watch mode one compact object per line, so the stream pipes into jq.
            self.stdout.write(status.render_json(reports, indent=None if stream else 2))
        else:
            self.stdout.write(
                "\n".join(
                    status.render_text(report, title=f"cache {alias!r}")
                    for alias, report in reports.items()
                ),
                ending="",
            )
        return max(status.exit_code(report) for report in reports.values())

    def _watch(
        self,
        cores: dict[str, ShardedSentinelPool],
        options: dict[str, Any],
        timeout: float,
        interval: float,
        iterations: int | None,
    ) -> int:
        """Refresh until Ctrl-C (or ``iterations``); returns the last refresh's exit code."""
        code = 0
        done = 0
        try:
            while iterations is None or done < iterations:
                started = time.monotonic()
                if not options["json"]:
                    self.stdout.write(CLEAR_SCREEN, ending="")
                code = self._show(cores, options, timeout, stream=True)
                if not options["json"]:
                    self.stdout.write(
                        f"refreshing every {interval:g}s; Ctrl-C to stop (exit code {code})"
                    )
                self.stdout.flush()
                done += 1
                if iterations is not None and done >= iterations:
                    break
                time.sleep(max(0.0, interval - (time.monotonic() - started)))
        except KeyboardInterrupt:
            self.stdout.write("")
        return code


def _config_error(message: str) -> CommandError:
    """A CommandError whose exit code says "configuration error", not "degraded" (1)."""
    return CommandError(message, returncode=status.EXIT_CONFIG)
