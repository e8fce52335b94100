"""``STAMPEDE_PROTECTION`` through Django's ``get_or_set``/``aget_or_set`` (issue 26): threads of
one process and tasks of one loop compute a cold key once; off, Django's own behaviour."""

from __future__ import annotations

import asyncio
import threading
import time

from django_support import MakeCache
from threads import Workers


def test_threads_compute_a_cold_key_once(make_cache: MakeCache) -> None:
    cache = make_cache(OPTIONS={"MASTERS": ["shard0", "shard1"], "STAMPEDE_PROTECTION": True})
    runs: list[int] = []
    got: list[object] = []
    lock = threading.Lock()

    def compute() -> str:
        with lock:
            runs.append(1)
        time.sleep(0.2)
        return "page"

    with Workers(timeout=20) as workers:
        for _ in range(16):
            workers.spawn(lambda: got.append(cache.get_or_set("cold", compute, 60)))
    assert runs == [1] and got == ["page"] * 16
    assert cache.get("cold") == "page" and 0 < cache.ttl("cold") <= 60


def test_async_tasks_compute_a_cold_key_once(make_cache: MakeCache) -> None:
    cache = make_cache(OPTIONS={"MASTERS": ["shard0", "shard1"], "STAMPEDE_PROTECTION": True})
    runs: list[int] = []

    def compute() -> str:
        runs.append(1)
        return "async page"

    async def main() -> list[object]:
        try:
            return await asyncio.gather(*(cache.aget_or_set("acold", compute) for _ in range(10)))
        finally:
            await cache.aclose()

    assert asyncio.run(main()) == ["async page"] * 10 and runs == [1]


def test_without_the_option_django_computes_in_every_missing_caller(make_cache: MakeCache) -> None:
    """The behaviour the option changes: Django's get, compute, add in each thread."""
    cache = make_cache(OPTIONS={"MASTERS": ["shard0", "shard1"]})
    runs: list[int] = []
    lock = threading.Lock()
    start = threading.Barrier(8)

    def compute() -> str:
        with lock:
            runs.append(1)
        time.sleep(0.2)
        return "page"

    def call() -> None:
        start.wait(5)
        cache.get_or_set("cold", compute, 60)

    with Workers(timeout=20) as workers:
        for _ in range(8):
            workers.spawn(call)
    assert len(runs) > 1
