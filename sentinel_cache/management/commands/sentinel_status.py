"""``manage.py sentinel_status``: the live state of every sharded Sentinel cache, for operators.

Exit code 0 healthy, 1 degraded (still serving), 2 down (a shard has no reachable master), 3 a
configuration or usage error (nothing was checked), so a probe or a deploy script can branch on
it; with several caches, the worst one wins. ``--fail-on down`` (for readiness probes) exits 0
while every shard can serve, whatever redundancy is missing (printed as warnings).
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from django.core.management.base import CommandParser

from sentinel_cache.core.admin import status
from sentinel_cache.core.topology.sharded_pool import ShardedSentinelPool
from sentinel_cache.django.checks import BACKEND
from sentinel_cache.django.commands import SentinelCacheCommand, config_error

CLEAR_SCREEN = "\033[H\033[2J"
DEFAULT_WATCH_SECONDS = 2.0


class Command(SentinelCacheCommand):
    help = (
        "Show every shard's master, replicas, sentinels and failover readiness for the caches "
        f"using {BACKEND}. Exit code: 0 healthy, 1 degraded, 2 down, 3 configuration error."
    )

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

    def handle(self, *args: Any, **options: Any) -> None:
        timeout = options["timeout"]
        watch = options["watch"]
        if timeout is None or timeout <= 0:
            raise config_error(f"--timeout must be a positive number of seconds (got {timeout})")
        if watch is not None and watch <= 0:
            raise config_error(f"--watch must be a positive number of seconds (got {watch})")
        cores = {alias: self.core(alias) for alias in self.aliases(options["cache"])}
        if watch is None:
            code = self._show(cores, options, timeout)
        else:
            code = self._watch(cores, options, timeout, watch, options["iterations"])
        if code:
            raise SystemExit(code)

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
