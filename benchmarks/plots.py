"""A small grouped bar-chart writer (SVG, standard library only) for the benchmark page.

``bar_chart`` draws one group of bars per category (an operation, a workload), one bar per
series (a contender) in every group, on a linear or a log scale, with an optional reference
line (the floor, at 1.0x). A missing value (None) leaves its slot empty. Every bar carries a
``<title>`` with its series, category and value, so a browser shows the figure on hover.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from xml.sax.saxutils import escape

PALETTE = (
    "#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1",
    "#ff9da7", "#9c755f", "#bab0ac", "#1b9e77", "#d95f02", "#7570b3", "#e7298a",
)  # fmt: skip
WIDTH_PER_BAR, GROUP_GAP, PLOT_HEIGHT = 9, 18, 260
LEFT, TOP, BOTTOM, LEGEND_ROW = 64, 40, 70, 18


def _ticks(low: float, high: float, log: bool) -> list[float]:
    if log:
        ticks = []
        for exponent in range(math.floor(math.log10(low)), math.ceil(math.log10(high)) + 1):
            for mantissa in (1, 2, 5):
                value = mantissa * 10.0**exponent
                if low <= value <= high:
                    ticks.append(value)
        return ticks
    raw = high / 5
    step = 10 ** math.floor(math.log10(raw))
    step = next(m * step for m in (1, 2, 5, 10) if m * step >= raw)
    return [i * step for i in range(int(high / step) + 1)]


def _label(value: float) -> str:
    if value >= 1000:
        return f"{value:,.0f}"
    return f"{value:g}" if value >= 1 else f"{value:.2g}"


def bar_chart(
    title: str,
    categories: Sequence[str],
    series: Sequence[tuple[str, Sequence[float | None]]],
    *,
    unit: str,
    log: bool = False,
    reference: float | None = None,
) -> str:
    """The SVG text of a grouped bar chart: ``series`` is ``[(name, one value per category)]``.

    Raises ``ValueError`` (naming the series) when a series has the wrong number of values or a
    value a bar cannot show (negative, or not above 0 on a log scale)."""
    for name, values in series:
        if len(values) != len(categories):
            raise ValueError(
                f"series {name!r} has {len(values)} values for {len(categories)} categories"
            )
        for v in values:
            if v is not None and (v < 0 or (log and v <= 0) or not math.isfinite(v)):
                raise ValueError(f"series {name!r}: value {v!r} cannot be drawn")
    present = [v for _, values in series for v in values if v is not None]
    if reference is not None:
        present.append(reference)
    if not present:
        raise ValueError(f"chart {title!r} has no values")
    if log:
        low = 10 ** math.floor(math.log10(min(present)))
        high = 10 ** math.ceil(math.log10(max(present)))
        if high == low:
            high = low * 10

        def y(v: float) -> float:
            return TOP + PLOT_HEIGHT * (1 - math.log10(v / low) / math.log10(high / low))

    else:
        low, high = 0.0, max(present) * 1.1 or 1.0

        def y(v: float) -> float:
            return TOP + PLOT_HEIGHT * (1 - v / high)

    group_width = WIDTH_PER_BAR * len(series) + GROUP_GAP
    # Wide enough for the title (about 8 px a character at 14 px bold) and a legend column.
    width = max(LEFT + group_width * len(categories) + 20, LEFT + 8 * len(title), 320)
    legend_top = TOP + PLOT_HEIGHT + BOTTOM
    per_line = max(1, (width - LEFT) // 230)
    height = legend_top + LEGEND_ROW * math.ceil(len(series) / per_line) + 10
    base = TOP + PLOT_HEIGHT
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="11">',
        f"<title>{escape(title)}</title>",
        '<rect width="100%" height="100%" fill="white"/>',
        f'<text x="{LEFT}" y="20" font-size="14" font-weight="bold">{escape(title)}</text>',
        f'<text x="12" y="{TOP + PLOT_HEIGHT / 2:.1f}" transform="rotate(-90 12 '
        f'{TOP + PLOT_HEIGHT / 2:.1f})" text-anchor="middle">{escape(unit)}</text>',
    ]
    for tick in _ticks(low if log else 0.0, high, log):
        ty = y(tick)
        out.append(
            f'<line x1="{LEFT}" x2="{width - 20}" y1="{ty:.1f}" y2="{ty:.1f}" stroke="#ddd"/>'
            f'<text x="{LEFT - 4}" y="{ty + 4:.1f}" text-anchor="end">{_label(tick)}</text>'
        )
    for g, category in enumerate(categories):
        x0 = LEFT + g * group_width + GROUP_GAP / 2
        for s, (name, values) in enumerate(series):
            value = values[g]
            if value is None:
                continue
            top = y(value) if (value > 0 or not log) else base
            x = x0 + s * WIDTH_PER_BAR
            out.append(
                f'<rect class="bar" x="{x:.1f}" y="{top:.1f}" width="{WIDTH_PER_BAR - 1}" '
                f'height="{base - top:.1f}" fill="{PALETTE[s % len(PALETTE)]}">'
                f"<title>{escape(name)}, {escape(category)}: {_label(value)} "
                f"{escape(unit)}</title></rect>"
            )
        cx = x0 + WIDTH_PER_BAR * len(series) / 2
        out.append(
            f'<text x="{cx:.1f}" y="{base + 14}" text-anchor="end" '
            f'transform="rotate(-30 {cx:.1f} {base + 14})">{escape(category)}</text>'
        )
    out.append(f'<line x1="{LEFT}" x2="{width - 20}" y1="{base}" y2="{base}" stroke="#333"/>')
    if reference is not None:
        ry = y(reference)
        out.append(
            f'<line class="reference" x1="{LEFT}" x2="{width - 20}" y1="{ry:.1f}" '
            f'y2="{ry:.1f}" stroke="#000" stroke-dasharray="4 3"/>'
        )
    for s, (name, _) in enumerate(series):
        lx = LEFT + (s % per_line) * 230
        ly = legend_top + (s // per_line) * LEGEND_ROW
        out.append(
            f'<rect x="{lx}" y="{ly - 9}" width="10" height="10" '
            f'fill="{PALETTE[s % len(PALETTE)]}"/>'
            f'<text x="{lx + 14}" y="{ly}">{escape(name)}</text>'
        )
    out.append("</svg>")
    return "\n".join(out) + "\n"
