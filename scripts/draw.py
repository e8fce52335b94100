"""Draw the docs' pictures: ``scripts/diagrams/NAME.txt`` -> ``docs/img/NAME.svg``.

A picture is a small description, one shape per line (``shlex`` words; a line starting with
``#`` is a comment); the
layout is the coordinates written there, so a redraw is exact and needs no dependency::

    canvas W H "title"                     the picture's size and accessible title
    style NAME fill=#hex stroke=#hex       a named look for boxes, bars and arrows
    box ID X Y W H STYLE "bold" "line" ..  a rounded box, its lines centred (the first bold)
    bar X Y W H STYLE "label"              a flat box with one line (a timeline's span)
    text X Y "words" [size=12] [anchor=start|middle|end] [bold=1] [color=#hex]
    arrow X1 Y1 X2 Y2 [STYLE] [label=".."] [dash=1] [side=left|right]
    line X1 Y1 X2 Y2 [dash=1] [color=#hex]

``python scripts/draw.py`` writes every picture; ``--check`` exits 1 naming the pictures whose
committed SVG differs from what the description draws (as ``unasync.py --check`` does).
"""

from __future__ import annotations

import argparse
import re
import shlex
import sys
from pathlib import Path
from typing import NamedTuple
from xml.sax.saxutils import escape

ROOT = Path(__file__).resolve().parent.parent
SOURCES = ROOT / "scripts" / "diagrams"
OUTPUT = ROOT / "docs" / "img"
FONT = "Helvetica, Arial, sans-serif"
LINE = 16  # px between lines of a box


class Style(NamedTuple):
    fill: str = "#ffffff"
    stroke: str = "#444444"


class DiagramError(Exception):
    """A description line that cannot be drawn (names the file and line)."""


def _split(words: list[str]) -> tuple[list[str], dict[str, str]]:
    """Positional words, and ``key=value`` options."""
    positional, options = [], {}
    for word in words:
        match = re.fullmatch(r"([a-z]+)=(.*)", word, re.DOTALL)
        if match:
            options[match.group(1)] = match.group(2)
        else:
            positional.append(word)
    return positional, options


def _text(
    x: float,
    y: float,
    words: str,
    *,
    size: int = 12,
    anchor: str = "start",
    bold: bool = False,
    color: str = "#222222",
) -> str:
    weight = ' font-weight="bold"' if bold else ""
    return (
        f'<text x="{x:g}" y="{y:g}" font-size="{size}" text-anchor="{anchor}"{weight} '
        f'fill="{color}">{escape(words)}</text>'
    )


def render(source: str, name: str = "<diagram>") -> str:
    """The SVG (text) a description draws."""
    styles: dict[str, Style] = {"default": Style()}
    width, height, title = 800.0, 600.0, name
    shapes: list[str] = []
    for number, raw in enumerate(source.splitlines(), 1):
        if raw.lstrip().startswith("#"):  # a comment line ("#" inside a line is a colour)
            continue
        try:
            words = shlex.split(raw)
        except ValueError as exc:
            raise DiagramError(f"{name}:{number}: {exc}") from None
        if not words:
            continue
        kind, (args, options) = words[0], _split(words[1:])
        try:
            if kind == "canvas":
                width, height, title = float(args[0]), float(args[1]), args[2]
            elif kind == "style":
                styles[args[0]] = Style(
                    options.get("fill", "#ffffff"), options.get("stroke", "#444444")
                )
            elif kind in ("box", "bar"):
                shapes += _box(kind, args, styles)
            elif kind == "text":
                x, y, words_ = float(args[0]), float(args[1]), args[2]
                shapes.append(
                    _text(
                        x,
                        y,
                        words_,
                        size=int(options.get("size", 12)),
                        anchor=options.get("anchor", "start"),
                        bold=options.get("bold") == "1",
                        color=options.get("color", "#222222"),
                    )
                )
            elif kind in ("arrow", "line"):
                shapes += _arrow(kind, args, options, styles)
            else:
                raise DiagramError(f"unknown shape {kind!r}")
        except (IndexError, ValueError, KeyError, DiagramError) as exc:
            raise DiagramError(f"{name}:{number}: {raw.strip()!r}: {exc}") from None
    head = [
        '<?xml version="1.0" encoding="UTF-8"?>',
        f"<!-- Drawn by scripts/draw.py from scripts/diagrams/{name}.txt: edit that, then run "
        "python scripts/draw.py -->",
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width:g}" height="{height:g}" '
        f'viewBox="0 0 {width:g} {height:g}" font-family="{FONT}" role="img">',
        f"<title>{escape(title)}</title>",
        '<defs><marker id="head" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" '
        'markerHeight="7" orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" '
        'fill="#444444"/></marker></defs>',
        f'<rect x="0" y="0" width="{width:g}" height="{height:g}" fill="#ffffff"/>',
    ]
    return "\n".join([*head, *shapes, "</svg>"]) + "\n"


def _box(kind: str, args: list[str], styles: dict[str, Style]) -> list[str]:
    if kind == "box":
        _id, rest = args[0], args[1:]
    else:
        rest = args
    x, y, w, h = (float(v) for v in rest[:4])
    style = styles[rest[4]]
    lines = rest[5:]
    radius = 8 if kind == "box" else 2
    out = [
        f'<rect x="{x:g}" y="{y:g}" width="{w:g}" height="{h:g}" rx="{radius}" '
        f'fill="{style.fill}" stroke="{style.stroke}" stroke-width="1.5"/>'
    ]
    if lines and lines[0] == "@top":  # a container: its title at the top, the rest inside it
        out.append(_text(x + 12, y + 20, lines[1], size=13, bold=True))
        return out
    first = y + h / 2 - (len(lines) - 1) * LINE / 2 + 4
    for i, words in enumerate(lines):
        bold = kind == "box" and i == 0
        out.append(
            _text(
                x + w / 2,
                first + i * LINE,
                words,
                size=13 if bold else 12,
                anchor="middle",
                bold=bold,
            )
        )
    return out


def _arrow(
    kind: str, args: list[str], options: dict[str, str], styles: dict[str, Style]
) -> list[str]:
    x1, y1, x2, y2 = (float(v) for v in args[:4])
    color = options.get("color") or (styles[args[4]].stroke if len(args) > 4 else "#444444")
    dash = ' stroke-dasharray="5,4"' if options.get("dash") == "1" else ""
    head = ' marker-end="url(#head)"' if kind == "arrow" else ""
    out = [
        f'<line x1="{x1:g}" y1="{y1:g}" x2="{x2:g}" y2="{y2:g}" stroke="{color}" '
        f'stroke-width="1.5"{dash}{head}/>'
    ]
    label = options.get("label")
    if label:
        side = options.get("side", "right")
        mx, my = (x1 + x2) / 2, (y1 + y2) / 2
        if x1 == x2:  # vertical: beside it
            dx = 6 if side == "right" else -6
            out.append(
                _text(
                    mx + dx,
                    my + 4,
                    label,
                    size=11,
                    anchor="start" if side == "right" else "end",
                    color="#555555",
                )
            )
        else:
            out.append(_text(mx, my - 6, label, size=11, anchor="middle", color="#555555"))
    return out


def pictures() -> dict[Path, Path]:
    """Each description and the SVG it draws."""
    return {src: OUTPUT / f"{src.stem}.svg" for src in sorted(SOURCES.glob("*.txt"))}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare, write nothing")
    args = parser.parse_args(argv)
    stale = []
    for source, target in pictures().items():
        drawn = render(source.read_text(encoding="utf-8"), source.stem)
        if args.check:
            if not target.exists() or target.read_text(encoding="utf-8") != drawn:
                stale.append(str(target.relative_to(ROOT)))
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(drawn, encoding="utf-8")
            print(f"wrote {target.relative_to(ROOT)}")
    if stale:
        print(f"out of date (run python scripts/draw.py): {', '.join(stale)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
