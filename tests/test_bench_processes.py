"""``python -m benchmarks.processes``'s table: each contender's ratio to a reference is taken
round by round (the contenders of a round ran one after the other), then its median."""

from __future__ import annotations

from benchmarks.processes import summary


def test_the_ratios_are_paired_by_round() -> None:
    results = {
        "ours_django": {
            "rounds": [
                {"ops": 3000, "wall": 1.0, "cpu": 0.15, "errors": 0},
                {"ops": 1000, "wall": 1.0, "cpu": 0.05, "errors": 1},
                {"ops": 2600, "wall": 2.0, "cpu": 0.13, "errors": 0},
            ]
        },
        "raw": {
            "rounds": [
                {"ops": 2000, "wall": 1.0, "cpu": 0.2, "errors": 0},
                {"ops": 500, "wall": 1.0, "cpu": 0.05, "errors": 0},
                {"ops": 2000, "wall": 2.0, "cpu": 0.2, "errors": 0},
            ]
        },
    }
    lines = summary(results, ["raw"]).splitlines()
    assert lines[0].startswith("| contender | ops/s median (min-max) | CPU µs per call | x raw")
    # per round 1.5x, 2.0x, 1.3x: median 1.5x (the ratio of the medians would be 1.3x)
    assert lines[2] == "| ours_django | 1,300 (1,000-3,000) | 50.0 | 1.500x (1.300-2.000) | 1 |"
    assert lines[3] == "| raw | 1,000 (500-2,000) | 100.0 | 1.000x (1.000-1.000) | 0 |"
