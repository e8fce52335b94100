"""benchmarks.ratios.paired on a fake clock (no server): each contender's median, and the median
of its per-sample ratios to the floor, whatever the order the calls take in a sample."""

from __future__ import annotations

import pytest

from benchmarks.ratios import paired


def test_paired_reports_medians_and_the_median_of_per_sample_ratios() -> None:
    now = [0.0]
    speed = [1.0]  # the machine slows down call after call: 0.1 % each, 2,200 calls in all

    def clock() -> int:
        return int(now[0])

    def call(cost: float) -> None:
        now[0] += cost * speed[0]
        speed[0] *= 1.001

    medians = paired(
        {"off": lambda: call(10_000), "on": lambda: call(11_000), "control": lambda: call(10_000)},
        "off",
        samples=700,
        clock=clock,
    )
    assert medians["off ratio"] == 1.0
    # Each sample's ratio is the 1.1 (or 1.0) of the calls themselves within the drift of two
    # calls, where the medians of the times drift with the machine (by 2x over the run).
    assert medians["on ratio"] == pytest.approx(1.1, abs=0.004)
    assert medians["control ratio"] == pytest.approx(1.0, abs=0.004)
    assert medians["off"] > 15.0  # µs: 10 at the start, ~30 at the end
