"""benchmarks/pinned_io.py without servers: each case calls its contender with the keys in
turn, a case's CPU is per call, the table puts each depth of ours over the floor of the same
replicas and op, and bad sizes are refused."""

from __future__ import annotations

import time

import pytest

from benchmarks import pinned_io


def test_cpu_per_call_divides_the_threads_cpu_by_the_calls() -> None:
    def busy(n: int) -> None:  # about 200 µs of CPU per call
        for _ in range(n):
            end = time.thread_time() + 200e-6
            while time.thread_time() < end:
                pass

    per_call = pinned_io.cpu_per_call(busy, 20)
    assert 190 <= per_call < 400


def test_the_table_gives_each_depth_over_the_floor_of_its_row() -> None:
    figures = {
        ("get", "ours Django"): 30.0,
        ("get", "ours execute"): 20.0,
        ("get", "floor"): 15.0,
        ("set", "ours Django"): 45.0,
        ("set", "ours execute"): 30.0,
        ("set", "floor"): 20.0,
    }
    rows = pinned_io.table({1: figures, 0: {k: v / 2 for k, v in figures.items()}}).splitlines()
    assert rows[2] == "| 0 | get | 15.0 | 10.0 | 7.5 | 2.00x | 1.33x |"
    assert rows[5] == "| 1 | set | 45.0 | 30.0 | 20.0 | 2.25x | 1.50x |"
    assert len(rows) == 2 + 2 * len(pinned_io.OPS)


@pytest.mark.parametrize("argv", [["--rounds", "0"], ["--calls", "0"], ["--replicas", "2"]])
def test_bad_sizes_are_refused_before_anything_starts(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        pinned_io.main(argv)
    assert exc.value.code == 2


def test_each_case_calls_its_contender_with_the_keys_in_turn() -> None:
    calls: list[tuple[str, tuple[object, ...], dict[str, object]]] = []

    def recorder(name: str):  # type: ignore[no-untyped-def]
        return lambda *args, **kwargs: calls.append((name, args, kwargs))

    class Core:
        def shard_for(self, key: str) -> str:
            return f"shard-of-{key}"

    class Codec:
        def dumps(self, value: object) -> bytes:
            return b"data"

    class Client:
        core, codec, execute = Core(), Codec(), staticmethod(recorder("execute"))

    class Cache:
        client = Client()
        get, set = staticmethod(recorder("django get")), staticmethod(recorder("django set"))

        def make_and_validate_key(self, name: str) -> str:
            return f"made:{name}"

    class Floor:
        get, set = staticmethod(recorder("floor get")), staticmethod(recorder("floor set"))

    todo = pinned_io.cases(Cache(), Floor())
    assert sorted(todo) == sorted((op, depth) for op in pinned_io.OPS for depth in pinned_io.DEPTHS)
    expected = {
        ("get", "ours Django"): ("django get", ("pinned-io:1",), {}),
        ("set", "ours Django"): ("django set", ("pinned-io:1", pinned_io.VALUE), {}),
        ("get", "ours execute"): (
            "execute", ("shard-of-made:pinned-io:1", [("GET", "made:pinned-io:1")]), {"write": False}
        ),
        ("set", "ours execute"): (
            "execute",
            (
                "shard-of-made:pinned-io:1",
                [("SET", "made:pinned-io:1", b"data", "PX", pinned_io.TIMEOUT * 1000)],
            ),
            {"write": True},
        ),
        ("get", "floor"): ("floor get", ("pinned-io-floor:1",), {}),
        ("set", "floor"): ("floor set", ("pinned-io-floor:1", pinned_io.VALUE), {}),
    }
    for case, call in expected.items():
        calls.clear()
        todo[case](pinned_io.KEYS + 2)  # the keys in turn, then around again
        assert len(calls) == pinned_io.KEYS + 2, case
        assert calls[1] == call, case
        assert calls[pinned_io.KEYS + 1] == call, case
