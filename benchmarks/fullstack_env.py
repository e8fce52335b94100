"""Where each full-stack contender runs: this interpreter, or the benchmark's own Python 3.12
virtualenv (``.cache/fullstack-py312``) for the contenders that need Python >= 3.12.

The virtualenv is built lazily by the benchmark's setup (never by ``make test``) with pyenv's
3.12 and holds the same versions of Django, uvicorn, gunicorn, redis-py, hiredis and
django-redis as this interpreter, this project (``pip install -e .``) and each contender's
package. A package that cannot be installed makes its contender *missing*, with pip's error.
"""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VENV = ROOT / ".cache" / "fullstack-py312"
PYENV_312 = Path(os.environ.get("FULLSTACK_PY312", "~/.pyenv/versions/3.12.1/bin/python"))
# Installed at the versions this interpreter has, so only the contender differs.
PINNED = ("Django", "uvicorn", "gunicorn", "redis", "hiredis", "django-redis")


class EnvError(RuntimeError):
    """The 3.12 virtualenv cannot be built (no 3.12 interpreter, pip failed)."""


def _run(argv: list[str], what: str) -> str:
    done = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT)
    if done.returncode != 0:
        tail = (done.stderr.strip() or done.stdout.strip())[-1500:]
        raise EnvError(f"{what} failed ({' '.join(argv[:6])} ...): {tail}")
    return done.stdout


def python_version(python: str) -> str:
    return _run([python, "-c", "import platform; print(platform.python_version())"], "").strip()


def package_version(python: str, package: str) -> str | None:
    code = (
        "import importlib.metadata as m, sys\n"
        "try: print(m.version(sys.argv[1]))\n"
        "except m.PackageNotFoundError: pass"
    )
    out = _run([python, "-c", code, package], f"asking {python} for {package}").strip()
    return out or None


def py312(log: Callable[[str], None]) -> str:
    """The 3.12 virtualenv's python, built (or completed) if needed."""
    python = VENV / "bin" / "python"
    if not python.exists():
        base = PYENV_312.expanduser()
        if not base.exists():
            raise EnvError(
                f"no Python 3.12 at {base} (pyenv install 3.12.1, or set FULLSTACK_PY312 to a "
                "3.12 interpreter): the contenders that need Python >= 3.12 cannot run"
            )
        log(f"building {VENV} with {base}")
        _run([str(base), "-m", "venv", str(VENV)], "creating the 3.12 virtualenv")
        _run([str(python), "-m", "pip", "install", "-q", "--upgrade", "pip"], "upgrading pip")
    wanted = [f"{name}=={importlib.metadata.version(name)}" for name in PINNED]
    have = [f"{name}=={package_version(str(python), name)}" for name in PINNED]
    if have != wanted:
        log(f"installing {' '.join(wanted)} into {VENV}")
        _run([str(python), "-m", "pip", "install", "-q", *wanted], "installing the servers")
    # Installed, not merely on PYTHONPATH (which the benchmark's own environment may set).
    bare = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    located = subprocess.run(
        [str(python), "-c", "import sentinel_cache; print(sentinel_cache.__file__)"],
        capture_output=True, text=True, cwd="/", env=bare,
    )  # fmt: skip
    if not located.stdout.strip().startswith(str(ROOT)):
        log(f"installing this project (pip install -e .) into {VENV}")
        _run([str(python), "-m", "pip", "install", "-q", "-e", str(ROOT)], "pip install -e .")
    return str(python)


def install(python: str, package: str, log: Callable[[str], None]) -> str:
    """``package``'s version in ``python``'s environment, installed if missing; raises
    ``EnvError`` with pip's error when it cannot be installed."""
    version = package_version(python, package)
    if version is None:
        log(f"installing {package} with {python}")
        _run([python, "-m", "pip", "install", "-q", package], f"pip install {package}")
        version = package_version(python, package)
        if version is None:
            raise EnvError(f"pip install {package} succeeded but {package} is not installed")
    return version


def this_python() -> str:
    return sys.executable
