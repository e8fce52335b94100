"""benchmarks/report.py's ratios and issue 27's targets, on fixed figures (no server): every
figure's ratio is to the 4-master floor and to the best peer of its column (never ours, never a
floor), and each target's verdict is computed from the figures it names."""

from __future__ import annotations

from typing import Any

import pytest

from benchmarks import async_mux, report


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
    ops = ("get", "set", "get_many[10]", "set_many[10]", "delete_many[10]")
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


def test_the_micro_targets_pass_and_fail_on_the_figures() -> None:
    good = report.micro_targets(pinned(10, 5, 10), many(100, 100, 160))
    assert {t["result"] for t in good} == {"PASS"}, good
    assert len(good) == 7
    assert target(good, "client CPU per get,")["detail"] == "10.0 vs 5.0 µs = 2.000x"
    assert target(good, "client CPU per set,")["target"].endswith("<= 2x the floor")
    bad = report.micro_targets(pinned(13, 5, 10), many(99, 100, 170))
    assert {t["result"] for t in bad} == {"FAIL"}, bad
    assert target(bad, "client CPU per get,")["detail"] == "13.0 vs 5.0 µs = 2.600x"
    # Just past a bound: the detail says by how much (3 decimals).
    close = report.micro_targets(pinned(10.01, 5, 10), many(100, 100, 160))
    assert target(close, "client CPU per get,")["result"] == "FAIL"
    assert target(close, "client CPU per get,")["detail"].endswith("= 2.002x")
    assert target(bad, "aget_many[10] at 64 tasks >= 0.6x")["detail"] == "99 vs 170 ops/s = 0.582x"
    # Issue 37 retired the targets that asked 4 shards to beat one server.
    names = " ".join(t["target"] for t in good)
    assert "redis-py" not in names and "4 processes" not in names


def test_a_target_without_its_figures_is_not_applicable() -> None:
    found = report.micro_targets({}, {})
    assert len(found) == 7
    assert {t["result"] for t in found} == {"N/A"}


def test_the_asyncio_multiplexed_targets_are_medians_of_the_rounds() -> None:
    def runs(*rates: float) -> list[dict[str, float]]:
        return [{"ops": rate, "wall": 1.0, "cpu": 0.1} for rate in rates]

    results = {
        "aget": {"ours mux": runs(60, 70, 10), "mux floor": runs(100, 100, 100)},
        "aset": {"ours mux": runs(50, 59, 90), "mux floor": runs(100, 100, 100)},
        "aget_many[10]": {"ours mux 4": runs(150, 160), "pooled floor 4": runs(100, 100)},
    }
    found = async_mux.targets(results)
    assert [t["result"] for t in found] == ["PASS", "FAIL", "PASS"], found
    assert found[0]["detail"] == "60 vs 100 ops/s = 0.600x"
    assert found[1]["detail"] == "59 vs 100 ops/s = 0.590x"
    assert (
        found[2]["target"].startswith("aget_many[10] at 64 tasks") and "1.5x" in found[2]["target"]
    )
    del results["aset"]["mux floor"]
    assert async_mux.targets(results)[1]["result"] == "N/A"
