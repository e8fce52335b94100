"""The operator commands' options, declared once for both frameworks.

``manage.py sentinel_status`` and ``flask sentinel-status`` (and the two reshard commands) are
rendered from these tables by thin front ends: argparse in ``sentinel_cache.django.commands``,
click in ``sentinel_cache.flask.commands``. So both take the same options with the same types,
defaults, choices and help, and refuse a bad value by the same rule, naming the option. What
differs is only what ``--cache`` selects: a Django alias, a Flask cache's key prefix.

Framework-free: no argparse or click here, only the table, the rules and the ``--watch`` loop.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from sentinel_cache.core.admin.reshard import DEFAULT_BATCH, DEFAULT_RETRY_FOR
from sentinel_cache.core.admin.states import FAIL_ON, STATUS_FAIL_ON, STATUS_TIMEOUT

__all__ = [
    "CLEAR_SCREEN",
    "DEFAULT_WATCH_SECONDS",
    "RESHARD",
    "STATUS",
    "Command",
    "Option",
    "watch",
]

CLEAR_SCREEN = "\033[H\033[2J"
DEFAULT_WATCH_SECONDS = 2.0

#: A value's check: the reason it is refused (``"must be ..."``), or None when it is fine.
Check = Callable[[Any], str | None]


def positive(unit: str) -> Check:
    def check(value: Any) -> str | None:
        return None if value > 0 else f"must be a positive number of {unit}"

    return check


def not_negative(value: Any) -> str | None:
    return None if value >= 0 else "must not be negative"


@dataclass(frozen=True)
class Option:
    """One option: ``--flag`` stored as ``dest``. ``type`` is ``bool`` for a flag (no value),
    else what the value is parsed as; ``const`` is the value of the bare option when its value
    is optional (``--watch`` alone: every 2 s); ``hidden`` keeps it out of the help."""

    flag: str
    dest: str
    help: str
    type: type = str
    default: Any = None
    choices: tuple[str, ...] = ()
    metavar: str | None = None
    check: Check | None = None
    const: Any = None
    hidden: bool = False

    def reason(self, value: Any) -> str | None:
        """Why ``value`` (parsed already; None: not given) is refused, or None if it is not."""
        if value is None:
            return None
        if self.choices and value not in self.choices:
            return f"must be one of {', '.join(self.choices)}"
        return None if self.check is None else self.check(value)

    def refusal(self, value: Any) -> str | None:
        """:meth:`reason` as a sentence naming the option and the value."""
        reason = self.reason(value)
        return None if reason is None else f"{self.flag} {reason} (got {value!r})"


@dataclass(frozen=True)
class Command:
    """A command: its names in each framework, its help, its options, and the options that
    only make sense with another one (``--sample`` needs ``--dry-run``)."""

    django_name: str
    flask_name: str
    help: str
    options: tuple[Option, ...]
    needs: Mapping[str, str] | None = None  # dest -> the flag dest it needs
    excludes: Mapping[str, str] | None = None  # dest -> the flag dest it cannot go with

    def option(self, dest: str) -> Option:
        for option in self.options:
            if option.dest == dest:
                return option
        raise KeyError(dest)

    def refusals(self, values: Mapping[str, Any]) -> list[str]:
        """Why these parsed values are refused, each naming its option (empty: they are fine)."""
        found = [r for o in self.options if (r := o.refusal(values.get(o.dest))) is not None]
        for dest, needed in (self.needs or {}).items():
            if values.get(dest) is not None and not values.get(needed):
                found.append(f"{self.option(dest).flag} needs {self.option(needed).flag}")
        for dest, other in (self.excludes or {}).items():
            given = values.get(dest) not in (None, self.option(dest).default)
            if given and values.get(other):
                found.append(
                    f"{self.option(dest).flag} cannot be used with {self.option(other).flag}"
                )
        return found


CACHE_HELP = (
    "Only this cache: its alias in settings.CACHES (Django) or its key prefix (Flask); "
    "default: every one using sentinel_cache."
)

STATUS = Command(
    django_name="sentinel_status",
    flask_name="sentinel-status",
    help="Show every shard's master, replicas, sentinels and failover readiness. Exit code: 0 "
    "healthy, 1 degraded (still serving), 2 down, 3 configuration error.",
    options=(
        Option("--cache", "cache", CACHE_HELP, metavar="CACHE"),
        Option("--json", "json", "Print the report as JSON.", type=bool, default=False),
        Option(
            "--watch",
            "watch",
            f"Refresh every SECONDS (default {DEFAULT_WATCH_SECONDS:g}) until Ctrl-C.",
            type=float,
            metavar="SECONDS",
            const=DEFAULT_WATCH_SECONDS,
            check=positive("seconds"),
        ),
        Option(
            "--timeout",
            "timeout",
            "Timeout of every probe, in seconds.",
            type=float,
            default=STATUS_TIMEOUT,
            metavar="SECONDS",
            check=positive("seconds"),
        ),
        Option(
            "--fail-on",
            "fail_on",
            "Exit non-zero when degraded (the default), or only when a shard cannot serve "
            "(down): for readiness probes, where missing redundancy is a warning.",
            default=STATUS_FAIL_ON,
            choices=FAIL_ON,
        ),
        # Bounds --watch, for tests.
        Option(
            "--iterations", "iterations", "", type=int, check=positive("refreshes"), hidden=True
        ),
    ),
)

RESHARD = Command(
    django_name="sentinel_reshard",
    flask_name="sentinel-reshard",
    help="Move the keys whose owner changed (MASTERS with PREVIOUS_MASTERS) to their new owner, "
    "or with --from-previous-cache the keys of the cache being replaced (PREVIOUS_CACHE). "
    "Exit code: 0 done, 1 finished with errors (run it again), 3 configuration error.",
    options=(
        Option("--cache", "cache", CACHE_HELP, metavar="CACHE"),
        Option(
            "--dry-run",
            "dry_run",
            "Move nothing: count what would move, per master pair, and warn about changes that "
            "move far more than needed.",
            type=bool,
            default=False,
        ),
        Option(
            "--rate",
            "rate",
            "Move at most this many keys a second (default: as fast as the servers go).",
            type=float,
            metavar="KEYS_PER_SECOND",
            check=positive("keys a second"),
        ),
        Option(
            "--match",
            "match",
            "Only keys matching this SCAN pattern (default: every key of the database).",
            default="*",
            metavar="PATTERN",
        ),
        Option("--json", "json", "Print the report as JSON.", type=bool, default=False),
        Option(
            "--from-previous-cache",
            "from_previous",
            "Instead: move every key of the cache being replaced (PREVIOUS_CACHE) into this "
            "one, never over a key this one has (its own key pattern is scanned: no --match, "
            "--retry-for).",
            type=bool,
            default=False,
        ),
        Option(
            "--sample",
            "sample",
            "With --dry-run: scan only this many keys per shard (default: every key).",
            type=int,
            metavar="KEYS",
            check=positive("keys per shard"),
        ),
        Option(
            "--batch",
            "batch",
            "Keys per SCAN and per round trip.",
            type=int,
            default=DEFAULT_BATCH,
            metavar="KEYS",
            check=positive("keys"),
        ),
        Option(
            "--retry-for",
            "retry_for",
            "How long a shard may be unavailable (a failover) before it is given up.",
            type=float,
            default=DEFAULT_RETRY_FOR,
            metavar="SECONDS",
            check=not_negative,
        ),
    ),
    needs={"sample": "dry_run"},
    excludes={"match": "from_previous", "retry_for": "from_previous"},
)


def watch(
    show: Callable[[], int],
    interval: float,
    *,
    iterations: int | None = None,
    before: Callable[[], None] = lambda: None,
    after: Callable[[int], None] = lambda code: None,
    stopped: Callable[[], None] = lambda: None,
    sleep: Callable[[float], None] | None = None,
) -> int:
    """``--watch``: ``show()`` (which returns an exit code) every ``interval`` seconds until
    Ctrl-C (then ``stopped()``), or ``iterations`` times; ``before`` and ``after(code)`` frame
    each refresh (clear the screen, say how to stop). Returns the last refresh's exit code.
    ``sleep`` is ``time.sleep``, looked up at the call (a test may stand in for it)."""
    pause = time.sleep if sleep is None else sleep
    code = 0
    done = 0
    try:
        while iterations is None or done < iterations:
            started = time.monotonic()
            before()
            code = show()
            after(code)
            done += 1
            if iterations is not None and done >= iterations:
                break
            pause(max(0.0, interval - (time.monotonic() - started)))
    except KeyboardInterrupt:
        stopped()
    return code
