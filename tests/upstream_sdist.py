"""Source distributions of installed packages, for running their own test suites against ours.

Used by the upstream-suite tests (Django's ``BaseCacheTests``, Flask-Caching's and cachelib's
suites). The sdist of the *installed* version is downloaded once with ``pip download`` into
``.cache/sdists`` (git-ignored) and reused. A download that still fails after one retry raises
:class:`SdistUnavailable`, which those tests turn into a failure: they never skip, so CI cannot
pass by silently running no upstream test.
"""

from __future__ import annotations

import importlib.metadata
import re
import subprocess
import sys
import tarfile
import time
from collections.abc import Iterable
from pathlib import Path

SDIST_DIR = Path(__file__).resolve().parent.parent / ".cache" / "sdists"


class SdistUnavailable(RuntimeError):
    """The sdist could not be downloaded, or lacks a wanted file."""


def _normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


def _find(dist: str, version: str) -> Path | None:
    for path in SDIST_DIR.glob("*.tar.gz"):
        name, _, found_version = path.name[: -len(".tar.gz")].rpartition("-")
        if _normalize(name) == _normalize(dist) and found_version == version:
            return path
    return None


def sdists(*dists: str) -> dict[str, Path]:
    """The cached sdist of each installed distribution in ``dists``, downloading the missing ones
    (one ``pip download`` for all of them; one retry after 2 s, then :class:`SdistUnavailable`)."""
    versions = {dist: importlib.metadata.version(dist) for dist in dists}
    outputs: list[str] = []
    for attempt in range(3):
        found = {dist: _find(dist, version) for dist, version in versions.items()}
        missing = [f"{dist}=={versions[dist]}" for dist, path in found.items() if path is None]
        if not missing:
            return {dist: path for dist, path in found.items() if path is not None}
        if attempt == 2:
            break
        if attempt:
            time.sleep(2)
        SDIST_DIR.mkdir(parents=True, exist_ok=True)
        command = [
            sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
            "--disable-pip-version-check", "--timeout", "30", "--dest", str(SDIST_DIR), *missing,
        ]  # fmt: skip
        done = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)
        outputs.append(f"exit {done.returncode}:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    raise SdistUnavailable(
        f"could not download the sdists of {missing} into {SDIST_DIR}:\n" + "\n".join(outputs)
    )


def sdist(dist: str) -> Path:
    """The cached sdist of the installed ``dist`` (see :func:`sdists`)."""
    return sdists(dist)[dist]


def extract(sdist: Path, members: Iterable[str], into: Path, prefix: str = "") -> None:
    """Write each of ``members`` (paths below the sdist's top directory, e.g.
    ``"tests/cache/tests.py"``) to ``into/<prefix><file name>``; a missing one raises
    :class:`SdistUnavailable`."""
    with tarfile.open(sdist) as archive:
        files = {m.name.split("/", 1)[-1]: m for m in archive.getmembers() if m.isfile()}
        for name in members:
            member = files.get(name)
            if member is None:
                raise SdistUnavailable(f"{sdist.name} has no {name}")
            source = archive.extractfile(member)
            assert source is not None
            (into / f"{prefix}{Path(name).name}").write_bytes(source.read())
