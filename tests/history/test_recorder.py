"""The recorder's pieces that need no server: an op's outcome kinds, step hooks (a client
pauses at the step until the nemesis has struck), planted patches. Pure and fast."""

from __future__ import annotations

import threading
import types
from typing import Any

from threads import Workers

from .recorder import FAIL, INFO, OK, Adapter, StepHook, _call, install_hooks, install_patches


class Scripted(Adapter):
    """An adapter whose calls answer from a script (no server)."""

    def __init__(self, **answers: Any) -> None:
        self.answers = answers

    def _answer(self, name: str) -> Any:
        answer = self.answers[name]
        if isinstance(answer, BaseException):
            raise answer
        return answer

    def get(self, key: str) -> Any:
        return self._answer("get")

    def incr(self, key: str, delta: int) -> int:
        return self._answer("incr")


def test_outcomes_are_ok_fail_or_indeterminate() -> None:
    ok = _call(0, "c", 1, "get", ("k",), (), Scripted(get="v"))
    assert (ok.kind, ok.value) == (OK, "v") and ok.invoke <= ok.complete
    missing = _call(0, "c", 2, "incr", ("c",), (1,), Scripted(incr=ValueError("no key")))
    assert (missing.kind, missing.error) == (FAIL, "ValueError: no key")
    unknown = _call(0, "c", 3, "incr", ("c",), (1,), Scripted(incr=ConnectionError("reset")))
    assert (unknown.kind, unknown.error) == (INFO, "ConnectionError: reset")


target = types.SimpleNamespace(calls=0)


def step() -> int:
    target.calls += 1
    return target.calls


def test_a_step_hook_pauses_the_first_client_there_until_released() -> None:
    module = __name__
    reached, released = threading.Event(), threading.Event()
    original = step
    install_hooks([StepHook("mid", f"{module}:step", wait=30)], {"mid": (reached, released)})
    try:
        results: list[int] = []
        with Workers(timeout=30) as workers:
            workers.spawn(lambda: results.append(globals()["step"]()), name="client")
            assert reached.wait(10)
            assert results == []  # paused at the step
            released.set()
        assert results == [1]
        assert globals()["step"]() == 2  # later calls pass straight through
    finally:
        globals()["step"] = original


def twice(original: Any) -> Any:
    return lambda: original() * 2


def test_a_planted_patch_replaces_its_target() -> None:
    original = step
    before = step()
    install_patches([(f"{__name__}:step", f"{__name__}:twice")])
    try:
        assert globals()["step"]() == (before + 1) * 2
    finally:
        globals()["step"] = original
