"""The coverage map (issue 35: "Every feature page in docs/ names the history scenarios that
cover it and the rules it relaxes"). Pure: reads docs/*.md and the scenario names in
tests/history/*.py, starts nothing.

The format, one line on each feature page (also stated in docs/reliability.md, "History
scenarios on feature pages")::

    History scenarios: `<scenario>`, `<scenario>`. Rules relaxed: `<rule>`, `<rule>`.

* the line starts with ``History scenarios:`` (at the start of a line, outside code blocks);
* then one or more backticked scenario names, separated by commas: each the first argument of
  a ``Scenario("...")`` in ``tests/history/*.py``, spelled exactly as there (a name built at
  run time, an f-string, cannot be named);
* then ``Rules relaxed:`` and backticked rule names from ``RULES`` (tests/history/checker.py),
  separated by commas, or the word ``none``;
* then a full stop, on the same line.

A page may hold more than one such line (one per section); each is checked, and together they
must name at least one scenario.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from .checker import RULES

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"

#: Pages that describe a behaviour the history checker judges under faults.
FEATURE_PAGES = (
    "failover.md",
    "near-cache.md",
    "resharding.md",
    "migration.md",
    "stampede.md",
    "configuration.md",  # timeouts and expiry ("Timeouts, keys and incr deltas")
)
#: Every other page, and why it is not a feature page (a new page must be put in one list).
NOT_FEATURE_PAGES = {
    "benchmarks-results.md": "generated figures",
    "benchmarks.md": "how the benchmarks run",
    "changelog.md": "history of releases",
    "compatibility.md": "the Python/Django/server version matrix",
    "contributing.md": "for contributors",
    "faq.md": "answers pointing to the feature pages",
    "index.md": "overview",
    "install.md": "installation",
    "java.md": "interop with Jedis: placement and value formats, no concurrency",
    "observability.md": "metrics and logs (not judged from a history)",
    "operations.md": "runbooks (the features they run are covered on their own pages)",
    "placement.md": "the ring's arithmetic (deterministic, tests/test_ring*.py)",
    "quickstart.md": "a tutorial",
    "reliability.md": "describes the checker itself",
    "security.md": "TLS, passwords, signing (not judged from a history)",
}
#: Pages given their line on another branch (helper 2b: the feature scenarios), merged by the
#: lead. Listed here so this branch stays green; once a page has its line, the test fails
#: until it is taken off this list (so the list empties itself at the merge).
AWAITING: set[str] = set()

LINE = re.compile(
    r"^History scenarios: (?P<scenarios>`[^`]+`(?:, `[^`]+`)*)\. "
    r"Rules relaxed: (?P<rules>none|`[a-z-]+`(?:, `[a-z-]+`)*)\.$"
)


def scenario_names() -> set[str]:
    """The first argument of every ``Scenario("...")`` in tests/history/*.py."""
    names: set[str] = set()
    for path in Path(__file__).parent.glob("*.py"):
        names |= set(re.findall(r'Scenario\(\s*"([^"]+)"', path.read_text()))
    return names


def coverage_lines(text: str) -> list[str]:
    """The lines starting ``History scenarios:`` outside fenced code blocks."""
    out, fenced = [], False
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and line.startswith("History scenarios:"):
            out.append(line)
    return out


def problems(page: str, text: str, known: set[str]) -> list[str]:
    """What is wrong with a feature page's coverage lines (empty: nothing)."""
    lines = coverage_lines(text)
    if not lines:
        return [f"{page}: no line starting 'History scenarios:'"]
    found: list[str] = []
    for line in lines:
        match = LINE.match(line)
        if match is None:
            found.append(f"{page}: {line!r} does not follow the format (see this module)")
            continue
        for name in re.findall(r"`([^`]+)`", match["scenarios"]):
            if name not in known:
                found.append(f"{page}: no scenario named {name!r} in tests/history")
        for rule in re.findall(r"`([^`]+)`", match["rules"]):
            if rule not in RULES:
                found.append(f"{page}: no rule named {rule!r} (RULES: {sorted(RULES)})")
    return found


def test_every_page_is_sorted_into_feature_or_not() -> None:
    pages = {p.name for p in DOCS.glob("*.md")}
    assert pages == set(FEATURE_PAGES) | set(NOT_FEATURE_PAGES)
    assert not set(FEATURE_PAGES) & set(NOT_FEATURE_PAGES)
    assert set(FEATURE_PAGES) >= AWAITING


@pytest.mark.parametrize("page", FEATURE_PAGES)
def test_a_feature_page_names_its_history_scenarios_and_relaxed_rules(page: str) -> None:
    known = scenario_names()
    if page in AWAITING:
        lines = coverage_lines((DOCS / page).read_text())
        assert not lines, f"{page} has its line now: take it off AWAITING"
        return
    assert problems(page, (DOCS / page).read_text(), known) == []


def test_the_check_catches_what_it_should() -> None:
    known = {"core, no fault"}
    good = "History scenarios: `core, no fault`. Rules relaxed: `stale-read`."
    assert LINE.match(good)
    assert LINE.match("History scenarios: `core, no fault`. Rules relaxed: none.")
    for bad in (
        "History scenarios: core, no fault. Rules relaxed: none.",  # not backticked
        "History scenarios: `core, no fault`. Rules relaxed: `stale-read`",  # no full stop
        "History scenarios: `core, no fault`.",  # no rules part
        "History scenarios: . Rules relaxed: none.",  # no scenario
    ):
        assert LINE.match(bad) is None, bad
    assert "core, no fault" in scenario_names()
    assert "core, get_or_set computing through a SIGKILL" in scenario_names()
    assert coverage_lines(f"```text\n{good}\n```\n") == []
    assert coverage_lines(f"intro\n{good}\n") == [good]
    assert problems("p.md", good, known) == []
    assert problems("p.md", "no line", known) == ["p.md: no line starting 'History scenarios:'"]
    unknown = "History scenarios: `core, typo`. Rules relaxed: `stale-reads`."
    assert problems("p.md", unknown, known) == [
        "p.md: no scenario named 'core, typo' in tests/history",
        f"p.md: no rule named 'stale-reads' (RULES: {sorted(RULES)})",
    ]
