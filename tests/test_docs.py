"""The documentation stays true: its samples run, its settings parse, its option table is complete.

* Every ```` ```python ```` block of ``docs/*.md`` is run, page by page in a fresh interpreter (this
  file is also the runner: ``python tests/test_docs.py --run docs/x.md --sentinels ...``), against
  a live local topology whose masters are named ``shard_a`` and ``shard_b``. Samples write the
  sentinels as ``10.0.0.1:26379``, ``10.0.0.2:26379``, ``10.0.0.3:26379`` (or as
  ``("10.0.0.1", 26379)`` pairs); those placeholders are replaced by the live sentinels, and a
  sample that would still name a ``10.x`` address is refused, never run.
* ``<!-- docs-test: config -->`` before a block: a settings snippet, evaluated (nothing connects)
  and validated: ``CACHES`` entries of our backend with the core parser and the codec, Flask
  ``CACHE_*`` settings by building the Flask-Caching backend, ``LOGGING`` with ``dictConfig``,
  ``SESSION_ENGINE`` and ``INSTALLED_APPS`` by importing them.
* ``<!-- docs-test: skip reason="..." -->``: not run; the reason is required.
* Django samples run with Django configured for the topology (our backend as ``default``).
* Every option of ``config.OPTION_NAMES`` has a row in ``docs/configuration.md`` and a default
  written there as a literal equals the code's (redis-py's for options the code leaves to it).
* ``mkdocs build --strict`` succeeds.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import importlib
import inspect
import re
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
CONFIG_PAGE = DOCS / "configuration.md"
BACKEND = "sentinel_cache.django.ShardedSentinelCache"
FLASK_BACKEND = "sentinel_cache.flask.ShardedSentinelCache"
MASTER_NAMES = ["shard_a", "shard_b"]
PLACEHOLDER_PORT = 26379
PAGE_TIMEOUT = 120

_MARKER = re.compile(r"^<!--\s*docs-test:\s*(?P<kind>[\w-]+)(?P<rest>.*?)-->\s*$")
_REASON = re.compile(r'^\s*reason="(?P<reason>[^"]*)"\s*$')
_PLACEHOLDER = re.compile(r"\b10\.0\.0\.([1-3]):26379\b")
_PLACEHOLDER_PAIR = re.compile(r'\(\s*"10\.0\.0\.([1-3])"\s*,\s*26379\s*\)')
_PRIVATE_TEN = re.compile(r"\b10\.\d{1,3}\.\d{1,3}\.\d{1,3}\b")
KINDS = ("run", "config", "skip")


class DocsError(Exception):
    """A docs page breaks the conventions above."""


@dataclasses.dataclass(frozen=True)
class Block:
    page: Path
    line: int  # 1-based line of the first line of code
    code: str
    kind: str  # "run", "config" or "skip"
    reason: str = ""

    @property
    def label(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def pages() -> list[Path]:
    return sorted(DOCS.glob("*.md"))


def extract_blocks(page: Path) -> list[Block]:
    """The ```` ```python ```` blocks of a page, with the marker on the line just before each."""
    lines = page.read_text(encoding="utf-8").splitlines()
    blocks: list[Block] = []
    pending: tuple[int, str, str] | None = None  # (line, kind, reason) of a marker
    i = 0
    while i < len(lines):
        line = lines[i]
        marker = _MARKER.match(line.strip())
        if marker:
            if pending is not None:
                raise DocsError(f"{page.name}:{pending[0]}: marker not followed by a python block")
            kind = marker["kind"]
            if kind not in ("config", "skip"):
                raise DocsError(f"{page.name}:{i + 1}: unknown docs-test marker {kind!r}")
            reason = ""
            if kind == "skip":
                found = _REASON.match(marker["rest"])
                reason = found["reason"].strip() if found else ""
                if not reason:
                    raise DocsError(f'{page.name}:{i + 1}: skip needs reason="why"')
            pending = (i + 1, kind, reason)
            i += 1
            continue
        fence = line.strip()
        if fence.startswith("```"):
            language = fence[3:].strip()
            end = i + 1
            while end < len(lines) and lines[end].strip() != "```":
                end += 1
            if end == len(lines):
                raise DocsError(f"{page.name}:{i + 1}: unclosed code fence")
            if language == "python":
                kind, reason = ("run", "") if pending is None else pending[1:]
                code = "\n".join(lines[i + 1 : end]) + "\n"
                blocks.append(Block(page, i + 2, code, kind, reason))
            elif pending is not None:
                raise DocsError(f"{page.name}:{pending[0]}: marker before a {language!r} block")
            pending = None
            i = end + 1
            continue
        if pending is not None and line.strip():
            raise DocsError(f"{page.name}:{pending[0]}: marker not directly before a code block")
        i += 1
    if pending is not None:
        raise DocsError(f"{page.name}:{pending[0]}: marker at the end of the page")
    return blocks


def substitute(code: str, sentinels: Sequence[str]) -> str:
    """Put the live sentinels in place of the placeholders; refuse any other 10.x address."""

    def address(number: str) -> tuple[str, int]:
        host, _, port = sentinels[int(number) - 1].rpartition(":")
        return host, int(port)

    code = _PLACEHOLDER.sub(lambda m: "{}:{}".format(*address(m[1])), code)
    code = _PLACEHOLDER_PAIR.sub(lambda m: '("{}", {})'.format(*address(m[1])), code)
    leftover = _PRIVATE_TEN.search(code)
    if leftover:
        raise DocsError(
            f"sample names {leftover[0]}, which is not a placeholder: only 10.0.0.1-3:26379 are "
            "replaced, and no test may contact any other address"
        )
    return code


# -- the runner (in a fresh interpreter per page) ------------------------------------------------


def _configure_django(sentinels: Sequence[str]) -> None:
    from django.conf import settings

    if settings.configured:
        return
    settings.configure(
        DEBUG=False,
        SECRET_KEY="docs-test-" + "x" * 40,
        USE_TZ=True,
        INSTALLED_APPS=[
            "django.contrib.contenttypes",
            "django.contrib.auth",
            "django.contrib.sessions",
            "sentinel_cache",
        ],
        DATABASES={"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}},
        DEFAULT_AUTO_FIELD="django.db.models.AutoField",
        CACHES={
            "default": {
                "BACKEND": BACKEND,
                "LOCATION": list(sentinels),
                "OPTIONS": {"MASTERS": MASTER_NAMES},
            }
        },
    )
    import django

    django.setup()


def _import_dotted(path: str) -> None:
    try:
        importlib.import_module(path)
    except ImportError:
        module, _, attr = path.rpartition(".")
        getattr(importlib.import_module(module), attr)


def validate_config(code: str, label: str) -> list[str]:
    """Evaluate a settings snippet and validate what it defines; returns what was checked."""
    from sentinel_cache.core.config import parse_cache_config
    from sentinel_cache.core.serializers import build_codec

    namespace: dict[str, Any] = {"__name__": "docs_settings"}
    exec(compile(code, label, "exec"), namespace)
    checked = []
    caches = namespace.get("CACHES")
    if caches is not None:
        # The entries our caches adopt (PREVIOUS_CACHE) are the old ones, left as they were.
        adopted = {
            value
            for entry in caches.values()
            for name, value in (entry.get("OPTIONS") or {}).items()
            if str(name).upper() == "PREVIOUS_CACHE"
        }
        for alias, entry in caches.items():
            if entry.get("BACKEND") != BACKEND:
                if alias in adopted:
                    continue
                raise DocsError(f"{label}: CACHES[{alias!r}] is not our backend; mark it skip")
            options = {
                name: value
                for name, value in (entry.get("OPTIONS") or {}).items()
                if str(name).upper() not in ("MAX_ENTRIES", "CULL_FREQUENCY", "PREVIOUS_CACHE")
            }
            _config, cache_options = parse_cache_config(entry.get("LOCATION"), options)
            build_codec(cache_options)
            checked.append(f"CACHES[{alias!r}]")
    flask_settings = {k: v for k, v in namespace.items() if k.startswith("CACHE_")}
    if flask_settings:
        from flask import Flask
        from flask_caching import Cache

        from sentinel_cache.flask import ShardedSentinelCache

        app = Flask("docs_test")
        app.config.update(flask_settings)
        cache = Cache(app)
        with app.app_context():
            if not isinstance(cache.cache, ShardedSentinelCache):
                raise DocsError(f"{label}: CACHE_TYPE is not {FLASK_BACKEND}")
        checked.append("Flask CACHE_* settings")
    if "LOGGING" in namespace:
        import logging.config

        logging.config.dictConfig(namespace["LOGGING"])
        checked.append("LOGGING")
    if "SESSION_ENGINE" in namespace:
        importlib.import_module(namespace["SESSION_ENGINE"])
        checked.append("SESSION_ENGINE")
    if "INSTALLED_APPS" in namespace:
        for app_name in namespace["INSTALLED_APPS"]:
            if app_name is not Ellipsis:
                _import_dotted(app_name)
        checked.append("INSTALLED_APPS")
    if not checked:
        raise DocsError(f"{label}: a config block must define CACHES, CACHE_*, LOGGING, ...")
    return checked


def run_page(page: Path, sentinels: Sequence[str]) -> int:
    """Run one page's blocks in order in one namespace; print a line per block."""
    from sentinel_cache.core.topology.sharded_pool import close_all

    namespace: dict[str, Any] = {"__name__": "__docs__"}
    try:
        for block in extract_blocks(page):
            if block.kind == "skip":
                print(f"skip {block.label}: {block.reason}")
                continue
            code = substitute(block.code, sentinels)
            # Blank lines first, so tracebacks give the line numbers of the page.
            padded = "\n" * (block.line - 1) + code
            if block.kind == "config":
                checked = validate_config(padded, str(block.page.relative_to(ROOT)))
                print(f"config {block.label}: {', '.join(checked)} valid")
            else:
                if "django" in code:
                    _configure_django(sentinels)
                exec(compile(padded, str(block.page.relative_to(ROOT)), "exec"), namespace)
                print(f"ran {block.label}")
    finally:
        close_all()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="run the python blocks of one docs page")
    parser.add_argument("--run", required=True, type=Path, help="the page")
    parser.add_argument("--sentinels", required=True, help="host:port,host:port,host:port")
    args = parser.parse_args(argv)
    sentinels = [s for s in args.sentinels.split(",") if s]
    if len(sentinels) != 3:
        parser.error("--sentinels needs the three sentinels of the docs topology")
    return run_page(args.run.resolve(), sentinels)


# -- the tests -----------------------------------------------------------------------------------


def _all_blocks() -> list[Block]:
    return [block for page in pages() for block in extract_blocks(page)]


def _pages_with_code() -> list[Path]:
    return [page for page in pages() if any(b.kind != "skip" for b in extract_blocks(page))]


def test_markers_and_blocks_are_well_formed() -> None:
    blocks = _all_blocks()  # raises DocsError on a bad marker
    kinds = {kind: sum(1 for b in blocks if b.kind == kind) for kind in KINDS}
    assert kinds["run"] >= 10 and kinds["config"] >= 5, kinds
    for block in blocks:
        if block.kind == "skip":
            assert block.reason, block.label
        else:
            compile(block.code, block.label, "exec")  # a syntax error names the page and line


def test_markers_are_parsed(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "text\n\n```python\nx = 1\n```\n\n<!-- docs-test: config -->\n```python\nLOGGING = {}\n```\n"
        '<!-- docs-test: skip reason="because" -->\n```python\nboom\n```\n\n```sh\nls\n```\n'
    )
    blocks = [(b.kind, b.line, b.code, b.reason) for b in extract_blocks(page)]
    assert blocks == [
        ("run", 4, "x = 1\n", ""),
        ("config", 9, "LOGGING = {}\n", ""),
        ("skip", 13, "boom\n", "because"),
    ]
    for bad in (
        "<!-- docs-test: skip -->\n```python\nx\n```\n",
        '<!-- docs-test: skip reason="" -->\n```python\nx\n```\n',
        "<!-- docs-test: nonsense -->\n```python\nx\n```\n",
        "<!-- docs-test: config -->\n\nsome text\n```python\nx\n```\n",
        "<!-- docs-test: config -->\n```sh\nls\n```\n",
    ):
        page.write_text(bad)
        with pytest.raises(DocsError):
            extract_blocks(page)


def test_placeholders_are_substituted_and_nothing_else_is_contacted() -> None:
    live = ["127.0.0.1:1001", "127.0.0.1:1002", "127.0.0.1:1003"]
    code = (
        'a = ["10.0.0.1:26379", "10.0.0.3:26379"]\n'
        'b = "sentinel://10.0.0.2:26379,10.0.0.1:26379/shard_a"\n'
        'c = [("10.0.0.2", 26379)]\n'
    )
    assert substitute(code, live) == (
        'a = ["127.0.0.1:1001", "127.0.0.1:1003"]\n'
        'b = "sentinel://127.0.0.1:1002,127.0.0.1:1001/shard_a"\n'
        'c = [("127.0.0.1", 1002)]\n'
    )
    for unsafe in ('x = "10.0.0.4:26379"', 'x = "10.1.2.3:6379"', 'x = ("10.0.0.1", 6379)'):
        with pytest.raises(DocsError):
            substitute(unsafe, live)


@pytest.fixture(scope="module")
def docs_topology(server_kind: str) -> Iterator[list[str]]:
    """A private topology (masters ``shard_a``, ``shard_b``): samples write and reconfigure."""
    from sentinel_cache.testing import LocalSentinelCluster

    with LocalSentinelCluster(
        shards=2, replicas=1, sentinels=3, master_names=MASTER_NAMES
    ) as cluster:
        yield list(cluster.config()["sentinels"])


@pytest.mark.parametrize("page", _pages_with_code(), ids=lambda p: p.name)
def test_page_samples_run(page: Path, docs_topology: list[str]) -> None:
    result = subprocess.run(
        [
            sys.executable,
            str(Path(__file__).resolve()),
            "--run",
            str(page),
            "--sentinels",
            ",".join(docs_topology),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=PAGE_TIMEOUT,
    )
    assert result.returncode == 0, (
        f"a sample in {page.relative_to(ROOT)} failed\n{result.stdout}\n{result.stderr}"
    )
    expected = sum(1 for b in extract_blocks(page) if b.kind != "skip")
    done = sum(1 for line in result.stdout.splitlines() if line.startswith(("ran ", "config ")))
    assert done == expected, result.stdout


# -- the configuration reference against the code -----------------------------------------------

_NOTHING = object()  # no default in the code: the page may say anything ("required", ...)
_ROW = re.compile(r"^\|\s*`(?P<name>[A-Z][A-Z0-9_]*)`\s*\|\s*(?P<default>[^|]*?)\s*\|")


def documented_options() -> dict[str, str]:
    """Option name -> its Default cell, from the tables of the "## Options" section."""
    text = CONFIG_PAGE.read_text(encoding="utf-8")
    start = text.index("\n## Options")
    end = text.find("\n## ", start + 1)
    rows: dict[str, str] = {}
    for line in text[start : end if end > 0 else None].splitlines():
        row = _ROW.match(line)
        if row:
            assert row["name"] not in rows, f"{row['name']} is documented twice"
            rows[row["name"]] = row["default"]
    return rows


def _redis_py_defaults() -> dict[str, Any]:
    import redis.connection

    defaults: dict[str, Any] = {}
    for cls in (redis.connection.Connection, redis.connection.SSLConnection):
        for klass in cls.__mro__:
            init = klass.__dict__.get("__init__")
            if init is None:
                continue
            for parameter in inspect.signature(init).parameters.values():
                if parameter.default is not inspect.Parameter.empty:
                    defaults.setdefault(parameter.name, parameter.default)
    return defaults


def code_defaults() -> dict[str, Any]:
    """Each option's default as the code (or, where it sets none, redis-py) has it."""
    from sentinel_cache.core.config import (
        DEFAULT_CONNECTION_KWARGS,
        DEFAULT_SENTINEL_KWARGS,
        OPTION_NAMES,
        CacheOptions,
        PoolConfig,
    )

    pool = {
        f.name: f.default
        for f in dataclasses.fields(PoolConfig)
        if f.default is not dataclasses.MISSING
    }
    cache = {f.name: f.default for f in dataclasses.fields(CacheOptions)}
    redis_py = _redis_py_defaults()
    found: dict[str, Any] = {}
    for name, (target, attr) in OPTION_NAMES.items():
        if target == "pool":
            found[name] = pool[attr]
        elif target == "cache":
            found[name] = cache[attr]
        elif target == "connection":
            found[name] = DEFAULT_CONNECTION_KWARGS.get(attr, redis_py.get(attr, _NOTHING))
        elif target == "sentinel":
            found[name] = DEFAULT_SENTINEL_KWARGS.get(attr, redis_py.get(attr, _NOTHING))
        elif target in ("ssl", "sentinel_ssl"):
            found[name] = False  # not set: a plain connection
        elif target in ("connection_kwargs", "sentinel_kwargs"):
            found[name] = {}
        else:
            found[name] = _NOTHING
    return found


def test_every_option_is_documented() -> None:
    from sentinel_cache.core.config import OPTION_NAMES

    documented = documented_options()
    missing = sorted(set(OPTION_NAMES) - set(documented))
    unknown = sorted(set(documented) - set(OPTION_NAMES))
    assert not missing, f"options missing from docs/configuration.md: {missing}"
    assert not unknown, f"docs/configuration.md documents options that do not exist: {unknown}"


def _same(documented: Any, actual: Any) -> bool:
    """Equal, and of the same kind (``2`` for ``2.0`` is fine; ``1`` for ``True`` is not)."""
    if isinstance(documented, bool) or isinstance(actual, bool):
        return type(documented) is type(actual) and documented == actual
    numbers = (int, float)
    if isinstance(documented, numbers) and isinstance(actual, numbers):
        return documented == actual
    return type(documented) is type(actual) and documented == actual


def test_documented_defaults_match_the_code() -> None:
    documented = documented_options()
    wrong = []
    for name, default in code_defaults().items():
        cell = documented.get(name, "")
        literal = re.search(r"`([^`]*)`", cell)
        if default is _NOTHING:
            continue
        if literal is None:
            wrong.append(f"{name}: the code's default is {default!r}, the page says {cell!r}")
            continue
        try:
            value = ast.literal_eval(literal[1])
        except (ValueError, SyntaxError):
            wrong.append(f"{name}: {literal[1]!r} is not a Python literal")
            continue
        if not _same(value, default):
            wrong.append(f"{name}: the page says {value!r}, the code has {default!r}")
    assert not wrong, "\n".join(wrong)


def test_mkdocs_build_strict(tmp_path: Path) -> None:
    # Not --quiet: with it, mkdocs 1.6 drops the warnings before --strict counts them, and a
    # link to a missing page or anchor built with exit code 0.
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "mkdocs",
            "build",
            "--strict",
            "--site-dir",
            str(tmp_path / "site"),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert (tmp_path / "site" / "configuration" / "index.html").exists()


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main())
