"""``manage.py sentinel_status``: the live state of every sharded Sentinel cache, for operators.

Exit code 0 healthy, 1 degraded (still serving), 2 down (a shard has no reachable master), 3 a
configuration or usage error (nothing was checked), so a probe or a deploy script can branch on
it; with several caches, the worst one wins. ``--fail-on down`` (for readiness probes) exits 0
while every shard can serve, whatever redundancy is missing (printed as warnings). The options
are declared in :data:`sentinel_cache.core.admin.commands.STATUS`, shared with
``flask sentinel-status``.
"""

from __future__ import annotations

import time
from typing import Any

from sentinel_cache.core.admin import commands, status
from sentinel_cache.core.admin.commands import CLEAR_SCREEN, DEFAULT_WATCH_SECONDS
from sentinel_cache.core.topology.sharded_pool import ShardedSentinelPool
from sentinel_cache.django.checks import BACKEND
from sentinel_cache.django.commands import SentinelCacheCommand

__all__ = ["CLEAR_SCREEN", "DEFAULT_WATCH_SECONDS", "Command"]


class Command(SentinelCacheCommand):
    spec = commands.STATUS
    help = f"{commands.STATUS.help} For the caches using {BACKEND}."

    def handle(self, *args: Any, **options: Any) -> None:
        self.refuse_bad_values(options)
        cores = {alias: self.core(alias) for alias in self.aliases(options["cache"])}
        interval = options["watch"]
        if interval is None:
            code = self._show(cores, options)
        else:
            text = not options["json"]

            def after(code: int) -> None:
                if text:
                    self.stdout.write(
                        f"refreshing every {interval:g}s; Ctrl-C to stop (exit code {code})"
                    )
                self.stdout.flush()

            code = commands.watch(
                lambda: self._show(cores, options, stream=True),
                interval,
                iterations=options["iterations"],
                before=lambda: self.stdout.write(CLEAR_SCREEN, ending="") if text else None,
                after=after,
                stopped=lambda: self.stdout.write(""),
                sleep=time.sleep,  # looked up now: a test may stand in for it
            )
        if code:
            raise SystemExit(code)

    def _show(
        self,
        cores: dict[str, ShardedSentinelPool],
        options: dict[str, Any],
        *,
        stream: bool = False,
    ) -> int:
        """Print one report per alias; returns the worst exit code."""
        reports = {
            alias: status.collect(core, timeout=options["timeout"], fail_on=options["fail_on"])
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
