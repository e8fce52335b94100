"""scripts/unasync.py refuses a substitution rule that matched nothing (issue 23): a rename in
the asyncio source must not silently stop a rule from being applied."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from types import ModuleType

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "unasync.py"


def load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("unasync_under_test", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_rule_matches_and_the_tree_is_current() -> None:
    assert load().main(["--check"]) == 0


def test_a_rule_that_matches_nothing_fails_the_check(capsys: pytest.CaptureFixture[str]) -> None:
    unasync = load()
    rule = (r"\bNoSuchAsyncName\b", "NoSuchName")
    unasync.SUBS.append(rule)
    unasync.COMPILED.append((re.compile(rule[0]), rule[1]))
    assert unasync.main(["--check"]) == 1
    assert "NoSuchAsyncName" in capsys.readouterr().err
