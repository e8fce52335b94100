"""Profiles of our hot paths (Django backend: get, set, get_many[100], set_many[100], incr).

cProfile gives exact call counts, so every function is reported per operation: how many times
it runs and how much of its own time it takes. Anything that runs once per call but could run
once per process (objects built per call, repeated lookups, encode/decode) shows up here.
pyinstrument, when installed, adds a wall-clock call tree of ``get``. Full listings go to
``benchmarks/results/profile-*.txt``.
"""

from __future__ import annotations

import cProfile
import io
import pstats
from pathlib import Path
from typing import Any

from benchmarks.contenders import Contender
from benchmarks.measure import VALUE, Keys, prepare

CALLS = {"get": 2000, "set": 2000, "incr": 2000, "get_many[100]": 200, "set_many[100]": 200}


def _workload(contender: Contender, op: str, keys: Keys, n: int) -> None:
    if op == "get":
        for i in range(n):
            contender.get(keys.data[i % len(keys.data)])
    elif op == "set":
        for i in range(n):
            contender.set(keys.data[i % len(keys.data)], VALUE)
    elif op == "incr":
        for _ in range(n):
            contender.incr(keys.counter)
    elif op == "get_many[100]":
        batches = keys.batches(keys.data, 100)
        for i in range(n):
            contender.get_many(batches[i % len(batches)])
    elif op == "set_many[100]":
        mappings = [dict.fromkeys(b, VALUE) for b in keys.batches(keys.data, 100)]
        for i in range(n):
            contender.set_many(mappings[i % len(mappings)])


ROOT = str(Path(__file__).resolve().parent.parent) + "/"


def _label(func: tuple[str, int, str]) -> str:
    """``path:line(function)``, the path relative to site-packages or to this checkout (the
    checkout's own, wherever it lives: tests/test_benchmarks_results.py looks the lines up)."""
    filename, line, name = func
    if filename.startswith(ROOT):
        filename = filename[len(ROOT) :]
    elif "site-packages/" in filename:
        filename = filename.split("site-packages/", 1)[1]
    if filename == "~":
        return name
    return f"{filename}:{line}({name})"


def profile(
    contenders: dict[str, Contender], out_dir: Path, top: int = 14
) -> dict[str, dict[str, Any]]:
    """Profile each op of each given contender; returns per-op summaries (per call)."""
    summaries: dict[str, dict[str, Any]] = {}
    for cid, contender in contenders.items():
        keys = Keys(f"bench:prof:{cid}")
        prepare(contender, keys)
        for op, n in CALLS.items():
            _workload(contender, op, keys, n // 10)  # warm
            profiler = cProfile.Profile()
            profiler.enable()
            _workload(contender, op, keys, n)
            profiler.disable()
            stats = pstats.Stats(profiler)
            text = io.StringIO()
            pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(40)
            safe = op.replace("[", "-").replace("]", "")
            (out_dir / f"profile-{cid}-{safe}.txt").write_text(text.getvalue())
            rows = []
            total = 0.0
            calls = 0
            for func, (_cc, nc, tt, _ct, _callers) in stats.stats.items():  # type: ignore[attr-defined]
                total += tt
                calls += nc
                rows.append((tt, nc, func))
            rows.sort(reverse=True)
            summaries[f"{cid}:{op}"] = {
                "calls": n,
                "profiled_us_per_call": total / n * 1e6,
                "function_calls_per_call": calls / n,
                "top": [
                    {
                        "function": _label(func),
                        "calls_per_op": nc / n,
                        "own_us_per_op": tt / n * 1e6,
                        "share": tt / total if total else 0.0,
                    }
                    for tt, nc, func in rows[:top]
                ],
            }
    return summaries


def pyinstrument_tree(contender: Contender, out_dir: Path) -> str | None:
    """A pyinstrument text tree of 3000 ``get`` calls, if pyinstrument is installed."""
    try:
        from pyinstrument import Profiler
    except ImportError:
        return None
    keys = Keys("bench:prof:tree")
    prepare(contender, keys)
    profiler = Profiler(interval=0.0002)
    profiler.start()
    _workload(contender, "get", keys, 3000)
    profiler.stop()
    text = profiler.output_text(unicode=False, color=False, show_all=False)
    (out_dir / "profile-pyinstrument-get.txt").write_text(text)
    return text
