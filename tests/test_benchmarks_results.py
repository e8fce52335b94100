"""docs/benchmarks-results.md is the generator's output, untouched (issue 21, item 8): its stamp
is well-formed, it has every section ``benchmarks/run.py`` writes, and every place in our code
that its profile cites exists. A page edited by hand, cut down or left behind by the code fails
here. Citations are checked against the sources of the commit the stamp names (the page is the
record of that commit's run; later commits may move lines without making it wrong), so the
stamped commit must be in this clone's history and its tree clean. Fast: it reads git objects,
starts no server."""

from __future__ import annotations

import ast
import datetime as dt
import re
import subprocess
import xml.etree.ElementTree as ET
from functools import cache
from pathlib import Path

from benchmarks import run
from benchmarks.page import CHARTS, FULLSTACK, GENERATED, SECTIONS

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "benchmarks-results.md"
STAMP = re.compile(
    r"^Stamp: commit `(?P<commit>[0-9a-f]{40})` \((?:clean tree|uncommitted changes)\), "
    r"run (?P<date>\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ) \(UTC\), (?P<seconds>\d+) s, "
    r"options beyond the defaults: (?P<options>.+)\.$",
    re.MULTILINE,
)
# cProfile's "path:line(function)", or a bare "path:line", of a file of ours.
CITED = re.compile(r"(?<![\w/])(sentinel_cache/[\w/]+\.py):(\d+)(?:\(([^)\s]+)\))?")


def page() -> str:
    return PAGE.read_text(encoding="utf-8")


def test_the_page_says_it_is_generated_and_carries_a_well_formed_stamp() -> None:
    text = page()
    assert text.splitlines()[0] == GENERATED
    stamps = list(STAMP.finditer(text))
    assert len(stamps) == 1, "exactly one stamp line (commit, tree, UTC time, options)"
    stamp = stamps[0]
    when = dt.datetime.strptime(stamp["date"], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.timezone.utc)
    assert dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc) < when < dt.datetime.now(dt.timezone.utc)
    # The command shown to reproduce the run is the generator's, with the stamp's options.
    options = stamp["options"]
    command = run.COMMAND if options == "none" else f"{run.COMMAND} {options.replace('`', '')}"
    assert f"```sh\n{command}\n```" in text
    assert int(stamp["seconds"]) > 0


# Sections added after a page was generated, with the module that writes each: a page stamped
# with a commit that lacks the module predates the section and is not expected to have it (the
# lead regenerates the page on a quiet machine); once stamped after it, the section is required.
NEWER_SECTIONS = {FULLSTACK: "benchmarks/fullstack.py"}


def expected_sections() -> list[str]:
    commit = stamped_commit()
    return [
        title
        for title in SECTIONS
        if title not in NEWER_SECTIONS or source_at(commit, NEWER_SECTIONS[title]) is not None
    ]


def test_the_page_has_every_section_the_generator_writes_in_order() -> None:
    titles = [line[3:] for line in page().splitlines() if line.startswith("## ")]
    assert titles == expected_sections()


def stamped_commit() -> str:
    stamp = STAMP.search(page())
    assert stamp is not None, "no stamp line"
    assert "(clean tree)" in stamp[0], "a committed page comes from a run on a clean tree"
    return stamp["commit"]


@cache
def source_at(commit: str, path: str) -> str | None:
    """``path`` as it was at ``commit``, or None when it did not exist there."""
    known = subprocess.run(
        ["git", "-C", str(ROOT), "cat-file", "-e", f"{commit}^{{commit}}"], capture_output=True
    )
    assert known.returncode == 0, f"the stamped commit {commit} is not in this clone's history"
    shown = subprocess.run(
        ["git", "-C", str(ROOT), "show", f"{commit}:{path}"], capture_output=True, text=True
    )
    return shown.stdout if shown.returncode == 0 else None


@cache
def spans(commit: str, path: str) -> tuple[int, dict[str, list[tuple[int, int]]]]:
    """The file's line count at ``commit`` and, per function name, the lines each definition
    covers (from its first decorator, the line cProfile names, to its last line)."""
    source = source_at(commit, path)
    assert source is not None
    found: dict[str, list[tuple[int, int]]] = {}
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            start = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            found.setdefault(node.name, []).append((start, node.end_lineno or node.lineno))
    return len(source.splitlines()), found


def test_every_place_the_page_cites_in_our_code_exists() -> None:
    cited = CITED.findall(page())
    assert cited, "the profile cites our own functions (a page without them was cut down)"
    commit = stamped_commit()
    wrong = []
    for path, number, function in set(cited):
        line = int(number)
        if source_at(commit, path) is None:
            wrong.append(f"{path}:{line}: no such file at {commit[:12]}")
            continue
        length, functions = spans(commit, path)
        if line > length:
            wrong.append(f"{path}:{line}: the file has {length} lines")
        elif (
            function
            and not function.startswith("<")  # <genexpr>, <lambda>: no name to look up
            and not any(a <= line <= b for a, b in functions.get(function, []))
        ):
            wrong.append(f"{path}:{line}({function}): not inside a function of that name")
    assert not wrong, "docs/benchmarks-results.md is stale or was edited; rerun " + (
        f"`{run.COMMAND}`:\n" + "\n".join(sorted(wrong))
    )


def test_the_page_shows_every_plot_the_generator_draws_and_each_is_an_svg() -> None:
    shown = re.findall(r"^!\[[^\]]*\]\(img/([\w.-]+\.svg)\)$", page(), re.MULTILINE)
    expected = [name for name, title in CHARTS.items() if title in expected_sections()]
    assert sorted(shown) == sorted(expected), "the page's plots are not the generator's"
    for name in shown:
        path = ROOT / "docs" / "img" / name
        assert path.is_file(), f"docs/img/{name} is missing: commit it with the page"
        root = ET.parse(path).getroot()
        assert root.tag == "{http://www.w3.org/2000/svg}svg", name
        assert root.findall(".//{http://www.w3.org/2000/svg}rect[@class='bar']"), name
