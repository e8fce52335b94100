"""benchmarks/compare.py's figures without its workers (fast, no servers): the per-call CPU of
an operation is its CPU over its calls, whether a chunk gave one sample per call (the sync
contenders) or one per chunk (the asyncio contender, whose calls overlap), and ``--only``
keeps the rows to the operations asked."""

from __future__ import annotations

from typing import Any

import pytest

from benchmarks import compare


def _round(samples_ns: list[int], cpu_ns: int, calls: int) -> dict[str, Any]:
    return {"ns": samples_ns, "cpu_ns": cpu_ns, "calls": calls}


def _rounds(side_scale: float) -> list[dict[str, Any]]:
    one = {
        contender: {
            op: (
                # asyncio: 2 chunks of 100 calls, one wall-per-call figure each
                _round([int(10_000 * side_scale), int(12_000 * side_scale)], 200 * 8_000, 200)
                if op in compare.ASYNC_OPERATIONS
                # sync: 4 calls, one sample each
                else _round([int(20_000 * side_scale)] * 4, 4 * 15_000, 4)
            )
            for op in ops
        }
        for contender, ops in compare.CONTENDERS.items()
    }
    return [one, one]


def test_cpu_per_call_divides_by_the_calls_and_the_median_is_over_the_samples() -> None:
    rows = compare.summarize({"base": _rounds(1.0), "head": _rounds(0.5)})
    by = {(r["contender"], r["op"]): r for r in rows}
    aget = by[("asyncio", "aget")]
    assert aget["base_cpu_us"] == pytest.approx(8.0)  # 1.6 ms over 200 calls, not over 2 samples
    assert aget["base_us"] == pytest.approx(11.0) and aget["ratio"] == pytest.approx(0.5)
    get = by[("core", "get")]
    assert get["base_cpu_us"] == pytest.approx(15.0) and get["base_us"] == pytest.approx(20.0)
    assert {r["contender"] for r in rows} == {"core", "django", "asyncio"}
    assert len(rows) == 2 * len(compare.SYNC_OPERATIONS) + len(compare.ASYNC_OPERATIONS)


def test_only_keeps_the_operations_asked() -> None:
    rows = compare.summarize({"base": _rounds(1.0), "head": _rounds(1.0)}, ("aset", "get"))
    assert sorted((r["contender"], r["op"]) for r in rows) == [
        ("asyncio", "aset"),
        ("core", "get"),
        ("django", "get"),
    ]
    with pytest.raises(SystemExit):  # an operation the tool does not know
        compare.main(["--base", "HEAD", "--only", "nope"])
