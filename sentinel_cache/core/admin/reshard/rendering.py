"""The commands' output: a plan and a report for a terminal, JSON, and the progress display."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from sentinel_cache.core.admin.reshard.planning import Plan
from sentinel_cache.core.admin.reshard.reports import Progress, Report

__all__ = ["ProgressPrinter", "render_json", "render_plan", "render_report"]


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def _table(header: Sequence[str], rows: Iterable[Sequence[Any]], indent: str = "  ") -> list[str]:
    cells = [list(map(str, header))] + [[str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    lines = []
    for row in cells:
        parts = [
            cell.ljust(width) if i == 0 else cell.rjust(width)
            for i, (cell, width) in enumerate(zip(row, widths, strict=True))
        ]
        lines.append((indent + "  ".join(parts)).rstrip())
    return lines


def _placement(names: Sequence[str], weights: Sequence[int]) -> str:
    text = "[" + ", ".join(names) + "]"
    if any(w != 1 for w in weights):
        text += " weights [" + ", ".join(map(str, weights)) + "]"
    return text


def render_plan(plan: Plan, *, title: str | None = None) -> str:
    """A dry run's plan for a terminal."""
    moves = plan.movement
    lines = []
    if title:
        lines.append(title)
    lines.append(
        f"Dry run: PREVIOUS_MASTERS {_placement(moves.previous, moves.previous_weights)} -> "
        f"MASTERS {_placement(moves.masters, moves.weights)}; nothing was moved."
    )
    how = (
        "a full scan" if plan.sample is None else f"a sample of up to {plan.sample:,} keys a shard"
    )
    lines.append(f"Keys matching {plan.match!r}, from {how} ({plan.seconds:.1f} s):")
    rows = []
    for s in plan.shards:
        share = f" ({s.moving / s.scanned:.1%})" if s.scanned else ""
        state = "error: " + s.error if s.error else ("scanned" if s.complete else "sampled")
        rows.append(
            [
                s.name + (" (leaving)" if s.leaving else ""),
                s.position,
                "?" if s.keys is None else f"{s.keys:,}",
                f"{s.scanned:,}",
                f"{s.moving:,}{share}",
                state,
            ]
        )
    lines += _table(["shard", "position", "keys", "scanned", "moving", ""], rows)
    if plan.flows:
        lines.append("Moves:")
        rows = []
        for f in plan.flows:
            share = f"{f.keys / plan.scanned:.1%}" if plan.scanned else "-"
            rows.append(
                [
                    f"{f.source} -> {f.target}",
                    f"{f.keys:,}",
                    f"{f.estimated:,}",
                    share,
                    f"{f.expected:.1%}",
                ]
            )
        lines += _table(["from -> to", "keys", "estimated", "of scanned", "expected"], rows)
    lines.append(
        f"Total: {plan.moving:,} of {plan.scanned:,} keys scanned would move ({plan.fraction:.1%}; "
        f"about {plan.estimated:,} in all). The rings say {moves.fraction:.1%}; the least any "
        f"placement could move is {moves.minimal:.1%}."
    )
    if plan.warnings:
        lines.append("Warnings:")
        lines += [f"  - {w}" for w in plan.warnings]
    return "\n".join(lines) + "\n"


def render_report(report: Report, *, title: str | None = None) -> str:
    """A migration's report for a terminal."""
    lines = []
    if title:
        lines.append(title)
    state = "done" if report.complete else "INCOMPLETE (run it again once the shards are back)"
    lines.append(
        f"Migration {state} in {report.seconds:.1f} s: {report.moved:,} keys moved "
        f"({report.rate:,.0f} keys/s), {report.already_present:,} already on their owner, "
        f"{report.expired:,} expired before the move; {report.scanned:,} keys scanned "
        f"matching {report.match!r}."
    )
    if report.pairs:
        rows = [
            [
                f"{p.source} -> {p.target}",
                f"{p.moved:,}",
                f"{p.already_present:,}",
                f"{p.expired:,}",
            ]
            for p in report.pairs
        ]
        lines += _table(["from -> to", "moved", "already present", "expired"], rows)
    rows = []
    for s in report.shards:
        state = "done" if s.complete else "error: " + (s.error or "incomplete")
        if s.complete and s.error:
            state = "done; " + s.error
        rows.append(
            [
                s.name + (" (leaving)" if s.leaving else ""),
                f"{s.scanned:,}",
                f"{s.moved + s.already_present + s.expired:,}",
                str(s.restarts),
                f"{s.seconds:.1f} s",
                state,
            ]
        )
    lines.append("Shards:")
    lines += _table(["shard", "scanned", "handled", "rescans", "time", ""], rows)
    return "\n".join(lines) + "\n"


def render_json(data: Any) -> str:
    return json.dumps(data, indent=2, sort_keys=False) + "\n"


class ProgressPrinter:
    """The commands' progress display: on a terminal one bar redrawn in place; otherwise a
    plain line when a shard is done and at most every ``interval`` seconds between."""

    def __init__(
        self,
        write: Callable[[str], None],
        *,
        tty: bool,
        interval: float = 5.0,
        width: int = 24,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.write = write
        self.tty = tty
        self.interval = interval
        self.width = width
        self.clock = clock
        self._last: float | None = None
        self._drawn = 0

    @staticmethod
    def line(p: Progress) -> str:
        return (
            f"shard {p.position + 1}/{p.shards} {p.shard}: scanned {p.scanned:,}/~{p.keys:,}, "
            f"moved {p.moved:,}; total moved {p.total_moved:,} at {p.rate:,.0f} keys/s, "
            f"ETA {_duration(p.eta)}"
        )

    def __call__(self, p: Progress) -> None:
        if self.tty:
            filled = int(round(p.fraction * self.width))
            bar = "#" * filled + "-" * (self.width - filled)
            text = f"[{bar}] {p.fraction:4.0%} {self.line(p)}"
            self.write("\r" + text + " " * max(0, self._drawn - len(text)))
            self._drawn = len(text)
            if p.done and p.error:
                self.write(f"\nshard {p.shard} given up: {p.error}\n")
                self._drawn = 0
            return
        now = self.clock()
        if p.done or self._last is None or now - self._last >= self.interval:
            self._last = now
            suffix = ""
            if p.done:
                suffix = f" (given up: {p.error})" if p.error else " (done)"
            self.write(self.line(p) + suffix + "\n")

    def close(self) -> None:
        """End the bar's line."""
        if self.tty and self._drawn:
            self.write("\n")
            self._drawn = 0
