"""benchmarks/report.py's ratios and issue 27's targets, on fixed figures (no server): every
figure's ratio is to the 4-master floor and to the best peer of its column (never ours, never a
floor), and each target's verdict is computed from the figures it names."""

from __future__ import annotations

from typing import Any

import pytest

from benchmarks import report


def test_the_best_peer_is_neither_ours_nor_a_floor_and_depends_on_the_direction() -> None:
    wall = {
        "floor_sharded": 10.0,
        "floor": 5.0,
        "raw": 30.0,
        "dr_default": 20.0,
        "ours_django": 1.0,
    }
    rel = report.ratios(wall, higher=False)
    assert {cid: r["peer"] for cid, r in rel.items()} == dict.fromkeys(wall, "dr_default")
    assert rel["ours_django"]["x_floor"] == pytest.approx(0.1)
    assert rel["ours_django"]["x_peer"] == pytest.approx(0.05)
    assert rel["raw"]["x_peer"] == pytest.approx(1.5)
    assert report.ratios(wall, higher=True)["ours_django"]["x_peer"] == pytest.approx(1 / 30)
    alone = report.ratios({"ours_django": 2.0, "floor": 1.0}, higher=False)["ours_django"]
    assert alone == {"x_floor": None, "x_peer": None, "peer": None}


def samples(us: float) -> dict[str, Any]:
    return {"samples_ns": [us * 1000] * 3, "round_medians_ns": [us * 1000], "cpu_ns": us * 3000}


def test_the_latency_table_shows_both_ratios_and_names_the_best_peer() -> None:
    lat = {
        "get": {"floor_sharded": samples(10), "raw": samples(25), "ours_django": samples(20)},
        "incr": {"floor_sharded": samples(8), "dr_default": samples(16), "ours_django": samples(4)},
    }
    header, rows, summary = report.latency_table(lat)
    assert header == ["contender", "masters", "get", "incr"]
    by_label = {row[0]: row for row in rows}
    assert by_label["sentinel_cache Django backend"][2:] == [
        "20.0 (2.00x / 0.80x)",
        "4.0 (0.50x / 0.25x)",
    ]
    assert by_label["best peer"][2:] == ["redis-py, 1 master", "django-redis DefaultClient"]
    assert summary["ours_django"]["get"]["cpu_x_floor"] == pytest.approx(2.0)


def target(found: list[dict[str, Any]], start: str) -> dict[str, Any]:
    matches = [t for t in found if t["target"].startswith(start)]
    assert len(matches) == 1, [t["target"] for t in found]
    return matches[0]


def pinned(ours: float, floor: float, raw: float) -> dict[str, Any]:
    ops = ("get", "get_many[10]", "set_many[10]", "delete_many[10]")
    return {
        "ours_django": {op: {"client_cpu_us": ours} for op in ops},
        "floor_sharded": {op: {"client_cpu_us": floor} for op in ops},
        "raw": {op: {"client_cpu_us": raw} for op in ops},
    }


def many(ours: float, peer: float, floor: float) -> dict[str, Any]:
    return {
        "aget_many[10]": {
            "ours": {"ops_per_s": ours},
            "redis.asyncio": {"ops_per_s": peer},
            "floor": {"ops_per_s": floor},
        }
    }


def procs(ours: float, raw: float) -> dict[str, Any]:
    return {
        "ours_django": {"median_ops_per_s": ours, "round_ops_per_s": [ours] * 3},
        "raw": {"median_ops_per_s": raw, "round_ops_per_s": [raw] * 3},
    }


def test_issue_27_targets_pass_and_fail_on_the_figures() -> None:
    good = report.issue27_targets(pinned(10, 5, 10), procs(1400, 1000), many(100, 100, 160))
    assert {t["result"] for t in good} == {"PASS"}, good
    assert len(good) == 8
    assert target(good, "client CPU per get,")["detail"] == "10.0 vs 5.0 µs = 2.000x"
    assert "(median of 3 rounds)" in target(good, "4 processes")["target"]
    bad = report.issue27_targets(pinned(13, 5, 10), procs(1200, 1000), many(99, 100, 170))
    assert {t["result"] for t in bad} == {"FAIL"}, bad
    assert target(bad, "client CPU per get,")["detail"] == "13.0 vs 5.0 µs = 2.600x"
    # Just short of a bound: the detail does not round up to it (1.2966x once read "1.30x").
    close = report.issue27_targets(pinned(10, 5, 10), procs(1296.6, 1000), many(100, 100, 160))
    assert target(close, "4 processes")["result"] == "FAIL"
    assert target(close, "4 processes")["detail"].endswith("= 1.297x")
    assert target(bad, "aget_many[10] at 64 tasks >= 0.6x")["detail"] == "99 vs 170 ops/s = 0.582x"


def test_a_target_without_its_figures_is_not_applicable() -> None:
    found = report.issue27_targets({}, {}, {})
    assert len(found) == 8
    assert {t["result"] for t in found} == {"N/A"}
