"""``manage.py sentinel_reshard``: move the keys whose owner changed in a resharding.

Run it once the new ``MASTERS`` are deployed with ``PREVIOUS_MASTERS`` (see the resharding page
of the docs). It scans every shard of the previous placement and moves each key that belongs to
another shard now, with its remaining TTL, never over a newer value; a second run moves nothing,
and a run that was stopped is simply started again. ``--dry-run`` only counts what would move,
and warns when the change moves far more keys than needed.

``--from-previous-cache`` instead empties the cache being replaced (``PREVIOUS_CACHE``, see
:mod:`sentinel_cache.django.previous`) into the sharded one, never over a key it has.

Exit code 0 done, 1 finished with errors (a shard was given up: run it again), 3 a configuration
or usage error (nothing was moved), as ``sentinel_status``. The options are declared in
:data:`sentinel_cache.core.admin.commands.RESHARD`, shared with ``flask sentinel-reshard``.
"""

from __future__ import annotations

from typing import Any

from django.core.cache import caches
from django.core.exceptions import ImproperlyConfigured

from sentinel_cache.core.admin import commands, reshard
from sentinel_cache.core.admin.reshard import previous
from sentinel_cache.core.config import CacheOptions
from sentinel_cache.core.topology.sharded_pool import ShardedSentinelPool
from sentinel_cache.django.checks import BACKEND
from sentinel_cache.django.commands import SentinelCacheCommand, config_error
from sentinel_cache.django.previous import AdoptingCache
from sentinel_cache.exceptions import ConfigurationError

EXIT_ERRORS = 1


class Command(SentinelCacheCommand):
    spec = commands.RESHARD
    help = f"{commands.RESHARD.help} For the caches using {BACKEND}."

    def handle(self, *args: Any, **options: Any) -> None:
        self.refuse_bad_values(options)
        if options["from_previous"]:
            code = self._from_previous(options)
            if code:
                raise SystemExit(code)
            return
        cores = self._cores(options["cache"])
        run = self._plan if options["dry_run"] else self._migrate
        code = run(cores, options)
        if code:
            raise SystemExit(code)

    # -- which caches ---------------------------------------------------------------------
    def _cores(self, alias: str | None) -> dict[str, ShardedSentinelPool]:
        """Alias -> core, one alias per core (aliases with equal settings share one), only those
        with PREVIOUS_MASTERS."""
        aliases = self.aliases(alias)
        cores: dict[str, ShardedSentinelPool] = {}
        seen: set[int] = set()
        for name in aliases:
            core = self.core(name)
            if core.previous_ring is not None and id(core) not in seen:
                seen.add(id(core))
                cores[name] = core
        if alias is not None and not cores:
            raise config_error(
                f"cache {alias!r} has no PREVIOUS_MASTERS: deploy the new MASTERS with "
                "PREVIOUS_MASTERS naming the placement before the change, then run this"
            )
        if not cores:
            raise config_error(
                f"no cache using {BACKEND} has PREVIOUS_MASTERS set: nothing to migrate "
                f"({', '.join(aliases)})"
            )
        return cores

    def _options_on(self, core: ShardedSentinelPool) -> list[CacheOptions]:
        """The options of every cache of ours on ``core`` (the migration moves all their keys:
        the strongest DURABLE_REPLICAS among them applies)."""
        found: list[CacheOptions] = []
        for alias in self.aliases(None):
            try:
                backend: Any = caches[alias]
                if backend.core is core:
                    found.append(backend.cache_options)
            except (ConfigurationError, ImproperlyConfigured):
                continue  # an alias that does not parse has no core, so not this one
        return found

    # -- the two modes --------------------------------------------------------------------
    def _plan(self, cores: dict[str, ShardedSentinelPool], options: dict[str, Any]) -> int:
        plans = {
            alias: reshard.plan(
                core,
                match=options["match"],
                sample=options["sample"],
                retry_for=options["retry_for"],
            )
            for alias, core in cores.items()
        }
        if options["json"]:
            data = {alias: p.to_dict() for alias, p in plans.items()}
            self.stdout.write(reshard.render_json(data), ending="")
        else:
            self.stdout.write(
                "\n".join(
                    reshard.render_plan(p, title=f"cache {alias!r}") for alias, p in plans.items()
                ),
                ending="",
            )
        return 0 if all(p.complete for p in plans.values()) else EXIT_ERRORS

    def _migrate(self, cores: dict[str, ShardedSentinelPool], options: dict[str, Any]) -> int:
        reports: dict[str, reshard.Report] = {}
        for alias, core in cores.items():
            printer = None
            if not options["json"]:
                printer = reshard.ProgressPrinter(
                    lambda text: self.stderr.write(text, ending=""), tty=self.stderr.isatty()
                )
                self.stderr.write(f"cache {alias!r}: migrating")
            try:
                reports[alias] = reshard.migrate(
                    core,
                    match=options["match"],
                    rate=options["rate"],
                    batch=options["batch"],
                    progress=printer,
                    retry_for=options["retry_for"],
                    **reshard.durability(self._options_on(core)),
                )
            except KeyboardInterrupt:
                if printer is not None:
                    printer.close()
                self.stderr.write(
                    "interrupted: the keys moved so far stay moved; run the command again to "
                    "continue (what is left stays readable through PREVIOUS_MASTERS)"
                )
                raise SystemExit(130) from None
            finally:
                if printer is not None:
                    printer.close()
        if options["json"]:
            data = {alias: r.to_dict() for alias, r in reports.items()}
            self.stdout.write(reshard.render_json(data), ending="")
        else:
            self.stdout.write(
                "\n".join(
                    reshard.render_report(r, title=f"cache {alias!r}")
                    for alias, r in reports.items()
                ),
                ending="",
            )
        return 0 if all(r.complete for r in reports.values()) else EXIT_ERRORS

    # -- --from-previous-cache ------------------------------------------------------------
    def _from_previous(self, options: dict[str, Any]) -> int:
        """Every key of each PREVIOUS_CACHE adopted (or, with --dry-run, counted)."""
        adopting = []
        for alias in self.aliases(options["cache"]):
            self.core(alias)  # a config error naming the alias if it does not parse
            cache = caches[alias]
            if isinstance(cache, AdoptingCache):
                try:
                    adopting.append((alias, *cache.adoption()))
                except ImproperlyConfigured as exc:
                    raise config_error(f"cache {alias!r}: {exc}") from exc
        if not adopting:
            raise config_error(
                f"no cache using {BACKEND} has PREVIOUS_CACHE set: set OPTIONS['PREVIOUS_CACHE'] "
                "to the alias of the cache being replaced, deploy, then run this"
            )
        printers: list[reshard.ProgressPrinter] = []

        def progress(title: str) -> reshard.ProgressPrinter | None:
            if options["json"]:
                return None
            for printer in printers:
                printer.close()
            self.stderr.write(f"{title}: migrating")
            printers.append(
                reshard.ProgressPrinter(
                    lambda text: self.stderr.write(text, ending=""), tty=self.stderr.isatty()
                )
            )
            return printers[-1]

        try:
            documents, texts, complete = previous.run_previous(
                adopting,
                dry_run=options["dry_run"],
                rate=options["rate"],
                batch=options["batch"],
                sample=options["sample"],
                progress=progress,
            )
        except ConfigurationError as exc:
            raise config_error(str(exc)) from exc
        except KeyboardInterrupt:
            self.stderr.write(
                "interrupted: the keys moved so far stay moved; run the command again to "
                "continue (what is left stays readable through PREVIOUS_CACHE)"
            )
            raise SystemExit(130) from None
        finally:
            for printer in printers:
                printer.close()
        if options["json"]:
            self.stdout.write(reshard.render_json(documents), ending="")
        else:
            self.stdout.write("\n".join(texts), ending="")
        return 0 if complete else EXIT_ERRORS
