"""Real Jedis for tests/java/ (a uniquely named module, as conftest names collide): where the
jars are (not in the repository: no Maven repository is reachable from the machines this project
runs on), and ``javac``.

The jar folder is ``$SENTINEL_CACHE_JEDIS_DIR`` when set (an error if it lacks a jar), else
``<repo>/../shared/java``, else ``/work/shared/java``. Without one, or without ``javac``, the
tests skip with a reason naming those places; tests/conftest.py allows that skip outside CI only
(``.ci/run`` checks the folder first and sets ``CI``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

JEDIS_DIR_ENV = "SENTINEL_CACHE_JEDIS_DIR"
ROOT = Path(__file__).resolve().parents[2]
DEFAULT_DIRS = (ROOT.parent / "shared" / "java", Path("/work/shared/java"))
JARS = {
    "2.9.0": ("jedis-2.9.0.jar", "commons-pool2-2.4.2.jar"),
    "3.9.0": ("jedis-3.9.0.jar", "commons-pool2-2.11.1.jar", "slf4j-api-1.7.32.jar"),
}
#: In the skip reason; tests/conftest.py's ALLOWED_SKIPS matches it.
SKIP_SAYS = "real Jedis tests need the Jedis jars"
WHERE = (
    f"set {JEDIS_DIR_ENV} to a folder holding {', '.join(sorted({j for v in JARS.values() for j in v}))}, "
    f"or put them in {DEFAULT_DIRS[0]} or {DEFAULT_DIRS[1]} (the project's shared/java folder, "
    "built from the projects' public sources: see its README)"
)


def jedis_dir() -> Path | None:
    """The folder holding every jar of :data:`JARS`, or None; an explicit folder must hold them."""
    wanted = [jar for jars in JARS.values() for jar in jars]
    explicit = os.environ.get(JEDIS_DIR_ENV)
    if explicit:
        missing = [jar for jar in wanted if not (Path(explicit) / jar).is_file()]
        if missing:
            raise RuntimeError(f"{JEDIS_DIR_ENV}={explicit} lacks {', '.join(missing)}")
        return Path(explicit)
    for folder in DEFAULT_DIRS:
        if all((folder / jar).is_file() for jar in wanted):
            return folder
    return None


def classpath(folder: Path, version: str, *extra: Path) -> str:
    return os.pathsep.join([*(str(folder / jar) for jar in JARS[version]), *map(str, extra)])


def compile_java(source: Path | str, name: str, cp: str, into: Path) -> Path:
    """``javac`` one class (a file, or its text) into ``into``; returns ``into``."""
    into.mkdir(parents=True, exist_ok=True)
    path = into / f"{name}.java"
    if isinstance(source, Path):
        shutil.copy(source, path)
    else:
        path.write_text(source, encoding="utf-8")
    done = subprocess.run(
        ["javac", "-nowarn", "-cp", cp, "-d", str(into), str(path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, f"javac {path.name} failed:\n{done.stdout}\n{done.stderr}"
    return into
