"""benchmarks/pinned_io.py's figures without servers: a case's CPU is per call, the table puts
each depth of ours over the floor of the same replicas and op, and bad sizes are refused."""

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
