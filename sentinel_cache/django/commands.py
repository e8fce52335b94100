"""What the operator commands (``sentinel_status``, ``sentinel_reshard``) share: their options,
rendered for argparse from the table in :mod:`sentinel_cache.core.admin.commands` (the one
``flask sentinel-status``/``sentinel-reshard`` are rendered from too); they run even when other
checks of the project fail, usage errors exit 3 like configuration errors (argparse's 2 would
read as "down"), and they find the caches that use this backend, by alias (``--cache``)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping
from typing import Any, ClassVar, NoReturn

from django.conf import settings
from django.core.cache import caches
from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError, CommandParser

from sentinel_cache.core.admin import commands, status
from sentinel_cache.core.topology.sharded_pool import ShardedSentinelPool
from sentinel_cache.django.checks import BACKEND, sentinel_aliases
from sentinel_cache.exceptions import ConfigurationError


def config_error(message: str) -> CommandError:
    """A CommandError whose exit code says "configuration error" (3)."""
    return CommandError(message, returncode=status.EXIT_CONFIG)


def add_options(parser: argparse.ArgumentParser, spec: commands.Command) -> None:
    """Every option of ``spec`` on ``parser``, as the table says (its checks run in
    :meth:`SentinelCacheCommand.refuse_bad_values`, once parsed)."""
    for option in spec.options:
        kwargs: dict[str, Any] = {"dest": option.dest}
        shown = option.help
        if option.type is bool:
            kwargs["action"] = "store_true"
        else:
            kwargs.update(type=option.type, default=option.default)
            if option.choices:
                kwargs["choices"] = option.choices
            else:
                kwargs["metavar"] = option.metavar
            if option.const is not None:
                kwargs.update(nargs="?", const=option.const)
            if option.default is not None:
                shown += " (default %(default)s)"
        kwargs["help"] = argparse.SUPPRESS if option.hidden else shown
        parser.add_argument(option.flag, **kwargs)


class SentinelCacheCommand(BaseCommand):
    # An operator's tool must run while something else in the project fails its checks.
    requires_system_checks: list[str] = []
    #: The command's options, from the table both frameworks render.
    spec: ClassVar[commands.Command]

    def add_arguments(self, parser: CommandParser) -> None:
        add_options(parser, self.spec)

    def refuse_bad_values(self, options: Mapping[str, Any]) -> None:
        """The table's checks of the parsed values: exit 3, naming the first option refused."""
        refused = self.spec.refusals(options)
        if refused:
            raise config_error(refused[0])

    def create_parser(self, prog_name: str, subcommand: str, **kwargs: Any) -> CommandParser:
        """Usage errors exit 3, like configuration errors."""
        parser = super().create_parser(prog_name, subcommand, **kwargs)

        def error(message: str) -> NoReturn:
            if parser.called_from_command_line:
                parser.print_usage(sys.stderr)
                parser.exit(status.EXIT_CONFIG, f"{parser.prog}: error: {message}\n")
            raise config_error(f"Error: {message}")

        parser.error = error  # type: ignore[method-assign]
        return parser

    def aliases(self, alias: str | None) -> list[str]:
        """``alias`` if it names a cache of ours, else every such alias; a config error if none."""
        ours = sentinel_aliases()
        if alias is None:
            if not ours:
                raise config_error(f"no cache in settings.CACHES uses {BACKEND}")
            return list(ours)
        configured = getattr(settings, "CACHES", {})
        if alias not in configured:
            known = ", ".join(sorted(configured)) or "none"
            raise config_error(f"unknown cache alias {alias!r} (settings.CACHES has: {known})")
        if alias not in ours:
            backend = configured[alias].get("BACKEND")
            raise config_error(f"cache {alias!r} uses {backend}, not {BACKEND}")
        return [alias]

    def core(self, alias: str) -> ShardedSentinelPool:
        """The alias's core (nothing connects); a config error naming the alias if it does not
        parse."""
        try:
            return caches[alias].core  # type: ignore[attr-defined]
        except (ConfigurationError, ImproperlyConfigured) as exc:  # the backend's, or Django's
            raise config_error(f"cache {alias!r}: {exc}") from exc
