"""A missing optional dependency is named, with the extra that installs it.

Each case runs a fresh interpreter whose ``sys.meta_path`` starts with a finder that refuses the
framework's modules (as if they were not installed), then imports the adapter for real. No server
is needed: importing an adapter connects nothing.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# Runs in the child: block the given top-level packages, import the adapter, report what happened.
_CHILD = textwrap.dedent(
    """
    import importlib, json, sys

    blocked = set(sys.argv[2].split(",")) if sys.argv[2] else set()

    class Blocker:
        def find_spec(self, name, path=None, target=None):
            if name.partition(".")[0] in blocked:
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
            return None

    sys.meta_path.insert(0, Blocker())
    try:
        importlib.import_module(sys.argv[1])
    except ImportError as exc:
        cause = exc.__cause__
        print(json.dumps({
            "type": type(exc).__name__,
            "is_module_not_found": isinstance(exc, ModuleNotFoundError),
            "message": str(exc),
            "name": exc.name,
            "cause": type(cause).__name__ if cause is not None else None,
            "cause_name": getattr(cause, "name", None),
        }))
    else:
        print(json.dumps({"type": None}))
    """
)


def _import(module: str, blocked: tuple[str, ...]) -> dict[str, object]:
    result = subprocess.run(
        [sys.executable, "-c", _CHILD, module, ",".join(blocked)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    report: dict[str, object] = json.loads(result.stdout.strip().splitlines()[-1])
    return report


@pytest.mark.parametrize(
    ("module", "blocked", "extra"),
    [
        ("sentinel_cache.flask", ("flask_caching",), "flask"),
        ("sentinel_cache.flask", ("flask", "flask_caching", "click"), "flask"),
        ("sentinel_cache.flask.cache", ("flask_caching",), "flask"),
        ("sentinel_cache.django", ("django",), "django"),
        ("sentinel_cache.django.cache", ("django",), "django"),
    ],
)
def test_missing_framework_names_the_extra(
    module: str, blocked: tuple[str, ...], extra: str
) -> None:
    report = _import(module, blocked)
    assert report["type"] == "ModuleNotFoundError", report
    assert report["is_module_not_found"], report
    message = str(report["message"])
    assert f'pip install "sentinel-cache[{extra}]"' in message, message
    # Re-raised `from` the original error, which names the missing module.
    assert report["cause"] == "ModuleNotFoundError", report
    assert report["cause_name"] in blocked, report
    assert report["name"] == report["cause_name"], report


@pytest.mark.parametrize("module", ["sentinel_cache.flask", "sentinel_cache.django"])
def test_adapters_import_when_the_framework_is_installed(module: str) -> None:
    assert _import(module, ())["type"] is None


def test_the_core_needs_no_framework() -> None:
    report = _import("sentinel_cache.core.topology.sharded_pool", ("django", "flask", "flask_caching"))
    assert report["type"] is None, report
