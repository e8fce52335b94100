"""benchmarks/fullstack.py without its load generator (fast, no wrk, no app server): wrk's
output parsed (captured samples), the app's connections told from the server's own clients,
the peaks, the targets' verdicts from fixed figures, the contenders' settings, and the app's
views under Django's test client against the session topology (ours, and Django's RedisCache
on the same first master)."""

from __future__ import annotations

import asyncio
import importlib.metadata
import re
import subprocess
import sys
import time
import uuid
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from typing import Any

import pytest
from minimal_django import configure_django

from benchmarks import fullstack, fullstack_wrk
from benchmarks.fullstack_app import caches
from sentinel_cache.testing import LocalSentinelCluster

# Captured: wrk 4.1.0 against a server answering 404 to every request (every answer non-2xx).
WRK_404 = """\
Running 2s test @ http://127.0.0.1:18777/nope
  2 threads and 20 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency    23.92ms   82.05ms 844.28ms   94.61%
    Req/Sec   548.35    377.99     1.40k    74.19%
  Latency Distribution
     50%    4.49ms
     75%    9.71ms
     90%   22.77ms
     99%  442.35ms
  1732 requests in 2.03s, 0.86MB read
  Non-2xx or 3xx responses: 1732
Requests/sec:    851.81
Transfer/sec:    432.56KB
"""


def test_a_wrk_report_is_parsed_into_rate_percentiles_and_errors() -> None:
    figures = fullstack_wrk.parse(WRK_404)
    assert figures["requests"] == 1732
    assert figures["seconds"] == pytest.approx(2.03)
    assert figures["req_per_s"] == pytest.approx(851.81)
    assert figures["p50_ms"] == pytest.approx(4.49)
    assert figures["p75_ms"] == pytest.approx(9.71)
    assert figures["p90_ms"] == pytest.approx(22.77)
    assert figures["p99_ms"] == pytest.approx(442.35)
    assert figures["non_2xx"] == 1732
    assert figures["errors"] == 1732


def test_socket_errors_count_as_errors_and_units_are_converted() -> None:
    text = (
        WRK_404.replace("  Non-2xx or 3xx responses: 1732\n", "")
        .replace("    4.49ms", "  500.00us")
        .replace("  442.35ms", "     1.50s")
        .replace("  1732 requests in 2.03s", "  1.20k requests in 1.00m")
        .replace(
            "Requests/sec:",
            "  Socket errors: connect 3, read 5, write 0, timeout 7\nRequests/sec:",
        )
    )
    figures = fullstack_wrk.parse(text)
    assert figures["p50_ms"] == pytest.approx(0.5)
    assert figures["p99_ms"] == pytest.approx(1500.0)
    assert figures["requests"] == 1200
    assert figures["seconds"] == pytest.approx(60.0)
    assert figures["socket_errors"] == {"connect": 3, "read": 5, "write": 0, "timeout": 7}
    assert figures["non_2xx"] == 0
    assert figures["errors"] == 15


def test_a_report_without_the_latency_distribution_is_refused_by_name() -> None:
    start = WRK_404.index("  Latency Distribution")
    end = WRK_404.index("  1732 requests")
    with pytest.raises(fullstack_wrk.WrkError, match="--latency"):
        fullstack_wrk.parse(WRK_404[:start] + WRK_404[end:])
    with pytest.raises(fullstack_wrk.WrkError, match="Requests/sec"):
        fullstack_wrk.parse(WRK_404.replace("Requests/sec", "Reqs"))


def test_the_wrk_command_is_bounded_in_time_and_asks_for_the_distribution() -> None:
    argv = fullstack_wrk.command("http://127.0.0.1:1/mix", connections=300, seconds=3)
    assert argv[0] == "wrk" and "--latency" in argv and "-d3s" in argv and "-c300" in argv
    assert "-t1" in fullstack_wrk.command("http://x/", connections=1, seconds=1)
    assert "-d4s" in fullstack_wrk.command("http://x/", connections=1, seconds=4.0)


@pytest.mark.parametrize("seconds", [0.5, 0, -1, float("nan"), float("inf")])
def test_a_duration_wrk_would_refuse_is_refused_by_name_before_anything_starts(
    seconds: float, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from benchmarks import run

    def nothing_starts(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("something started before the duration was checked")

    monkeypatch.setattr(fullstack_wrk, "ensure", nothing_starts)
    monkeypatch.setattr(fullstack, "run", nothing_starts)
    monkeypatch.setattr("sentinel_cache.testing.LocalSentinelCluster", nothing_starts)
    with pytest.raises(ValueError, match="seconds must be a whole number of seconds"):
        fullstack_wrk.command("http://x/", connections=1, seconds=seconds)
    for main, option in ((fullstack.main, "--seconds"), (run.main, "--fullstack-seconds")):
        with pytest.raises(SystemExit) as stopped:
            main([option, str(seconds)])
        assert stopped.value.code == 2
        assert f"{option} must be a whole number of seconds, 1 or more: {seconds!r}" in (
            capsys.readouterr().err
        )


def test_no_warmup_is_allowed_but_a_fraction_of_a_second_is_not(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert fullstack_wrk.whole_seconds("--warmup", 0, zero=True) == 0
    with pytest.raises(SystemExit):
        fullstack.main(["--warmup", "0.5"])
    assert "--warmup must be a whole number of seconds, 0 or more: 0.5" in capsys.readouterr().err


def test_the_apps_connections_exclude_the_sampler_sentinels_replication_and_earlier_ones() -> None:
    entries: list[dict[str, Any]] = [
        {"id": 1, "name": "", "flags": "N"},  # open before the app started
        {"id": 2, "name": "sentinel-1a2b3c4d-cmd", "flags": "N"},
        {"id": 3, "name": "sentinel-1a2b3c4d-pubsub", "flags": "P"},
        {"id": 4, "name": "", "flags": "S"},  # a replica's link
        {"id": 5, "name": "", "flags": "M"},
        {"id": 6, "name": "", "flags": "N"},  # the sampler itself
        {"id": 7, "name": "", "flags": "N"},  # the app
        {"id": 8, "name": None, "flags": "P"},  # the app's invalidation subscriber
        {"id": 9, "name": "anything", "flags": "x"},  # the app
    ]
    assert fullstack.app_clients(entries, {1, 6}) == 3
    assert fullstack.app_clients(entries, set()) == 5


def test_peaks_are_the_most_held_at_one_sample_and_on_one_node() -> None:
    samples = [
        {"per_node": {"a": 1, "b": 4}, "rss_kb": 2048},
        {"per_node": {"a": 3, "b": 3}, "rss_kb": 4096},
        {"per_node": {"a": 0, "b": 0}, "rss_kb": 1024},
    ]
    held = fullstack.peaks(samples)
    assert held["connections"] == 6  # 3 + 3 at once, not 3 + 4 from different samples
    assert held["max_per_node"] == 4
    assert held["per_node"] == {"a": 3, "b": 4}
    assert held["rss_mb"] == pytest.approx(4.0)
    assert fullstack.peaks([])["connections"] is None


def _round(rate: float, p99: float, *, per_node: int = 1, errors: int = 0) -> dict[str, Any]:
    return {
        "requests": int(rate * 3),
        "req_per_s": rate,
        "p50_ms": p99 / 2,
        "p99_ms": p99,
        "errors": errors,
        "server": {"connections": per_node, "max_per_node": per_node, "rss_mb": 60.0},
    }


def _data(cells: dict[str, Any], missing: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "settings": {"connections": [100], "rounds": 3, "seconds": 3, "warmup_s": 1},
        "contenders": {cid: {"python_version": "3.x", "version": "1"} for cid in cells},
        "missing": missing or {},
        "summary": fullstack.summarize(cells),
    }


def _lines(data: dict[str, Any]) -> dict[str, str]:
    return {t["target"]: t["result"] for t in fullstack.targets(data)}


def test_the_asgi_targets_compare_medians_of_the_rounds_to_the_named_contenders() -> None:
    cells = {
        "ours_1": {"uvicorn": {"100": [_round(r, 100) for r in (700, 650, 5)]}},  # median 650
        "ours_4": {"uvicorn": {"100": [_round(600, 100, per_node=3)]}},
        "django_vcache": {"uvicorn": {"100": [_round(640, 120), _round(600, 90)]}},  # 620, 105
        "dr_default": {"uvicorn": {"100": [_round(300, 400)]}},
        "django_redis_cache": {"uvicorn": {"100": [_round(400, 400)]}},
    }
    lines = _lines(_data(cells))
    asgi = "full stack, ASGI (uvicorn 1 worker), 100 connections: "
    assert lines[asgi + "ours (1 shard) req/s >= 1.0x django-vcache"] == "PASS"
    assert lines[asgi + "ours p99 <= django-vcache's p99"] == "PASS"
    assert lines[asgi + "ours req/s >= 2x django-redis"] == "PASS"  # 650 / 300
    assert lines[asgi + "ours req/s >= 2x Django RedisCache"] == "FAIL"  # 650 / 400
    conns = " holds <= 2 connections per shard per uvicorn worker"
    assert lines[asgi + "sentinel_cache, 1 shard" + conns] == "PASS"
    assert lines[asgi + "sentinel_cache, 4 shards" + conns] == "FAIL"
    cells["ours_1"]["uvicorn"]["100"] = [_round(610, 100)]
    lines = _lines(_data(cells))
    assert lines[asgi + "ours (1 shard) req/s >= 1.0x django-vcache"] == "FAIL"


def test_a_missing_contender_makes_its_targets_not_applicable_with_the_reason() -> None:
    cells = {
        "ours_1": {"gunicorn-sync": {"100": [_round(900, 50)]}},
        "dr_default": {"gunicorn-sync": {"100": [_round(800, 50)]}},
    }
    data = _data(cells, missing={"django_vcache": "pip install django-vcache failed: boom"})
    found = {t["target"]: t for t in fullstack.targets(data)}
    vcache = found[
        "full stack, ASGI (uvicorn 1 worker), 100 connections: ours (1 shard) req/s >= 1.0x django-vcache"
    ]
    assert vcache["result"] == "N/A" and "boom" in vcache["detail"]
    wsgi = found[
        "full stack, WSGI, gunicorn sync workers, 100 connections: ours (1 shard) req/s >= 1.0x every contender"
    ]
    assert wsgi["result"] == "PASS"  # ahead of everyone measured, and it says who was not
    assert "django-vcache" in wsgi["detail"] and "not measured" in wsgi["detail"]
    cells["dr_default"]["gunicorn-sync"]["100"] = [_round(950, 50)]
    found = {t["target"]: t for t in fullstack.targets(_data(cells))}
    assert found[wsgi["target"]]["result"] == "FAIL"
    assert "django-redis" in found[wsgi["target"]]["detail"]


def test_the_floor_is_a_yardstick_in_the_notes_and_in_no_target() -> None:
    cells = {
        "ours_1": {"gunicorn-gthread": {"100": [_round(900, 50)]}},
        "django_vcache": {"gunicorn-gthread": {"100": [_round(880, 50)]}},
        "floor_1": {"gunicorn-gthread": {"100": [_round(1000, 40)]}},  # ahead of ours
    }
    data = _data(cells)
    target = (
        "full stack, WSGI, gunicorn gthread 1 worker x 8 threads, 100 connections: "
        "ours (1 shard) req/s >= 1.0x every contender"
    )
    found = {t["target"]: t for t in fullstack.targets(data)}
    assert found[target]["result"] == "PASS", found[target]  # 900 vs vcache's 880
    assert "floor" not in found[target]["detail"]
    text = "\n".join(fullstack.notes(data))
    assert (
        "sentinel_cache, 1 shard over the floor (pure Python, no rules), req/s (the cost of "
        "ours' rules and layers in the whole request): gunicorn-gthread x100: 0.90x." in text
    )
    del cells["floor_1"]
    assert "over the floor" not in "\n".join(fullstack.notes(_data(cells)))


def test_the_tables_and_the_plot_show_every_measured_cell() -> None:
    cells = {
        "ours_1": {
            "uvicorn": {
                "100": [{**_round(650, 100), "cpu_ms_per_request": c} for c in (1.2, 1.1, 9)]
            },
            "gunicorn-sync": {"100": [_round(900, 50)]},
        },
        "django_vcache": {"uvicorn": {"100": [_round(325, 100)]}},
    }
    data = _data(cells)
    tables = fullstack.tables(data)
    assert len(tables) == 2  # uvicorn and gunicorn sync; gthread had nothing
    _, header, rows = tables[0]
    ours = dict(zip(header, rows[0], strict=True))
    assert ours["contender"] == "sentinel_cache, 1 shard"
    assert ours["x django-vcache"] == "2.00" and ours["x django-redis"] == "-"
    assert ours["server CPU ms/request"] == "1.20"  # the median of the rounds
    vcache = dict(zip(header, rows[1], strict=True))
    assert vcache["server CPU ms/request"] == "-"  # not measured (a report from before it)
    assert "Pinned" not in tables[0][0]
    data["settings"]["pinned"] = {"server": [0], "wrk and data nodes": [1, 2]}
    assert (
        "the app server alone on CPU 0, wrk and the data nodes on CPU 1,2"
        in (fullstack.tables(data)[0][0])
    )
    svg = fullstack.chart(data)
    assert svg is not None
    bars = ET.fromstring(svg).findall(".//{http://www.w3.org/2000/svg}rect[@class='bar']")
    assert len(bars) == 3
    assert fullstack.chart(_data({})) is None


def test_the_notes_say_where_each_ran_what_was_missing_what_failed_and_which_runs_were_short() -> (
    None
):
    short = {**_round(10, 2900), "first_errors": ["PoolExhaustedError: shard 3 (x): no free"]}
    cells = {
        "ours_4": {"uvicorn": {"300": [short]}},
        "ours_1": {"uvicorn": {"100": [_round(650, 100)]}},
    }
    data = {**_data(cells, missing={"django_cachex": "pip install django-cachex failed: boom"})}
    data["cells"] = cells
    text = "\n".join(fullstack.notes(data))
    assert "sentinel_cache, 1 shard 1 on Python 3.x" in text
    assert "django-cachex missing: pip install django-cachex failed: boom" in text
    assert "sentinel_cache, 4 shards on uvicorn answered 500: PoolExhaustedError" in text
    assert (
        "at 300 connections completed fewer requests than connections in 1 of 1 rounds (30)" in text
    )
    assert "at 100 connections" not in text


def test_each_contender_has_settings_and_the_environment_names_a_bad_one() -> None:
    topo: dict[str, Any] = {
        "sentinels": ["127.0.0.1:1"],
        "masters": ["a", "b", "c", "d"],
        "redis": "h:6",
    }
    for spec in caches.CONTENDERS:
        for api in ("asgi", "wsgi"):
            entry = caches.cache_entry(spec.id, api, **topo)
            assert entry["KEY_PREFIX"] == f"fs-{spec.id}" and entry["BACKEND"]
    assert caches.cache_entry("ours_1", "asgi", **topo)["OPTIONS"]["MASTERS"] == ["a"]
    assert caches.cache_entry("ours_4", "asgi", **topo)["OPTIONS"]["MASTERS"] == list("abcd")
    assert caches.cache_entry("django_vcache", "asgi", **topo)["LOCATION"] == "redis://h:6/0"
    assert "async" in caches.cache_entry("django_valkey", "asgi", **topo)["BACKEND"]
    assert "async" not in caches.cache_entry("django_valkey", "wsgi", **topo)["BACKEND"]
    with pytest.raises(ValueError, match="FULLSTACK_CONTENDER is not set"):
        caches.from_environment({})
    with pytest.raises(ValueError, match="'nope'"):
        caches.from_environment({"FULLSTACK_CONTENDER": "nope"})
    with pytest.raises(ValueError, match="ours_4 needs 4 masters"):
        caches.cache_entry("ours_4", "asgi", sentinels=[], masters=["a"], redis="h:6")
    with pytest.raises(ValueError, match="'grpc'"):
        caches.cache_entry("ours_1", "grpc", **topo)


def test_the_floor_backend_is_one_floor_per_location_and_refuses_a_bad_one() -> None:
    configure_django()
    from benchmarks.fullstack_app.floor_backend import FloorCache

    first, second = FloorCache("127.0.0.1:1", {}), FloorCache("127.0.0.1:1", {})
    assert first._floor is second._floor  # Django builds a backend per thread and request
    assert FloorCache("127.0.0.1:2", {})._floor is not first._floor
    with pytest.raises(ValueError, match="'redis://h:6/0'"):
        FloorCache("redis://h:6/0", {})
    with pytest.raises(ValueError, match="by 1 only, not 2"):
        first.incr("k", 2)


# --------------------------------------------------------------------------- the app's views


@pytest.fixture(params=["ours_1", "django_redis_cache", "floor_1"])
def app_cache(request: pytest.FixtureRequest, cluster: LocalSentinelCluster) -> Iterator[Any]:
    """The app's settings for a contender on the session topology (its first master is the
    plain server), with a key prefix of this test's own."""
    yield from _app_cache(request.param, cluster)


@pytest.fixture(params=["ours_1", "django_redis_cache"])
def checked_cache(request: pytest.FixtureRequest, cluster: LocalSentinelCluster) -> Iterator[Any]:
    """:func:`app_cache` of the caches whose ``incr`` of a missing key raises (the floor's
    makes it: it has no rule to check)."""
    yield from _app_cache(request.param, cluster)


def _app_cache(cid: str, cluster: LocalSentinelCluster) -> Iterator[Any]:
    configure_django()
    from django.core.cache import cache
    from django.test import override_settings

    host, port = cluster.master_address(cluster.master_names[0])
    entry = caches.cache_entry(
        cid,
        "asgi",
        sentinels=[f"{h}:{p}" for h, p in cluster.sentinel_addresses],
        masters=list(cluster.master_names),
        redis=f"{host}:{port}",
    )
    entry["KEY_PREFIX"] = f"fs-test-{uuid.uuid4().hex[:8]}"
    with override_settings(
        CACHES={"default": entry},
        ROOT_URLCONF="benchmarks.fullstack_app.views",
        ALLOWED_HOSTS=["testserver"],
    ):
        yield cache
        from benchmarks.fullstack_app import views

        cache.delete_many(list(views.fill_items()))  # the shared servers keep no leftovers


def _counters(cache: Any) -> int:
    from benchmarks.fullstack_app import views

    found = cache.get_many([views.counter_key(n) for n in range(views.BIG_KEYS)])
    assert len(found) == views.BIG_KEYS, "fill wrote every counter"
    return sum(found.values())


def test_the_sync_view_does_its_six_operations_after_the_fill(app_cache: Any) -> None:
    from django.test import Client

    from benchmarks.fullstack_app import views

    client = Client()
    assert client.get("/health").status_code == 200
    assert client.get("/fill").status_code == 200
    assert app_cache.get(views.big_key(7)) == views.BIG and len(views.BIG) == 4096
    for _ in range(3):
        answer = client.get("/mix")
        assert (answer.status_code, answer.content) == (200, b"ok")
    assert _counters(app_cache) == 3  # one incr per request


def test_the_async_view_does_its_six_operations_after_the_fill(app_cache: Any) -> None:
    from django.test import AsyncClient

    async def requests() -> list[tuple[int, bytes]]:
        client = AsyncClient()
        filled = await client.get("/afill")
        answers = [await client.get("/amix") for _ in range(3)]
        return [(filled.status_code, filled.content)] + [
            (a.status_code, a.content) for a in answers
        ]

    assert asyncio.run(requests()) == [(200, b"filled")] + [(200, b"ok")] * 3
    assert _counters(app_cache) == 3


def test_a_cache_error_answers_500_naming_it(checked_cache: Any) -> None:
    from django.test import Client

    answer = Client().get("/mix")  # no fill: the incr of a missing counter raises
    assert answer.status_code == 500
    assert b"ValueError" in answer.content


# --------------------------------------------------------------------------- setup and docs


def test_without_wrk_and_apt_get_the_setup_says_how_to_install_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(fullstack_wrk.shutil, "which", lambda name: None)
    with pytest.raises(fullstack_wrk.WrkError, match=r"apt-get install -y wrk"):
        fullstack_wrk.ensure(lambda message: None)


def test_make_bench_stops_before_any_section_when_wrk_cannot_be_had(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from benchmarks import run

    def no_wrk(log: Any) -> str:
        raise fullstack_wrk.WrkError(fullstack_wrk.INSTALL_HINT)

    def no_topology(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("a section started before wrk was checked")

    monkeypatch.setattr(fullstack_wrk, "ensure", no_wrk)
    monkeypatch.setattr("sentinel_cache.testing.LocalSentinelCluster", no_topology)
    with pytest.raises(SystemExit) as stopped:
        run.main(["--skip-failover"])
    assert stopped.value.code == 2
    assert "--skip-fullstack" in capsys.readouterr().err


def test_a_package_pip_cannot_install_makes_its_contender_missing_with_the_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from benchmarks import fullstack_env

    def refuse(python: str, package: str, log: Any) -> str:
        raise fullstack_env.EnvError(f"pip install {package} failed: no matching distribution")

    monkeypatch.setattr(fullstack_env, "py312", lambda log: fullstack_env.this_python())
    monkeypatch.setattr(fullstack_env, "install", refuse)
    ready, missing = fullstack.setup(
        ["ours_1", "django_vcache", "dr_default"], same_python=False, log=lambda message: None
    )
    assert list(ready) == ["ours_1", "dr_default"]
    assert ready["ours_1"]["python"] == fullstack_env.this_python()
    # Each contender's own version is reported, not Django's.
    assert ready["dr_default"]["version"] == importlib.metadata.version("django-redis")
    assert ready["ours_1"]["version"] == importlib.metadata.version("sentinel-cache")
    assert missing == {
        "django_vcache": "pip install django-vcache failed: no matching distribution"
    }


def test_the_servers_are_the_documented_shapes() -> None:
    shapes = {s.id: s for s in fullstack.servers()}
    uvicorn = shapes["uvicorn"].argv
    assert uvicorn[0] == "uvicorn" and uvicorn[2:4] == ("--workers", "1")
    assert "--loop" in uvicorn and uvicorn[uvicorn.index("--loop") + 1] == "asyncio"
    assert uvicorn[uvicorn.index("--http") + 1] == "h11"
    assert shapes["gunicorn-sync"].argv[-4:] == ("-k", "sync", "-w", "2")
    assert shapes["gunicorn-gthread"].argv[-6:] == ("-k", "gthread", "-w", "1", "--threads", "8")
    assert (shapes["uvicorn"].api, shapes["gunicorn-sync"].api) == ("asgi", "wsgi")
    assert fullstack.CONNECTIONS == (100, 300)


def test_every_option_the_docs_name_for_the_full_stack_exists() -> None:
    from pathlib import Path

    from benchmarks import run

    text = (Path(__file__).resolve().parent.parent / "docs" / "benchmarks.md").read_text()
    section = text.split("## The full-stack benchmark (issue 37)", 1)[1].split("\n## ", 1)[0]
    named = set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]+", section)) - {
        "--latency", "--loop", "--http",  # wrk's and uvicorn's own
    }  # fmt: skip
    known = {
        flag
        for parser in (fullstack._parser(), run._parser())
        for action in parser._actions
        for flag in action.option_strings
    }
    assert named and named <= known, sorted(named - known)
    for spec in caches.CONTENDERS:
        assert f"`{spec.id}`" in section, spec.id
    for shape in fullstack.servers():
        assert f"`{shape.id}`" in section, shape.id


def test_pinned_the_app_server_is_alone_on_the_first_cpu_and_the_load_on_the_others(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    monkeypatch.setattr(fullstack.os, "sched_getaffinity", lambda pid: {3, 1, 2})
    assert fullstack.pinned_cpus() == ({1}, {2, 3})
    shape = fullstack.servers()[0]
    server = fullstack.AppServer("py", shape, {}, tmp_path / "log", "1")
    assert server.argv[:5] == ["taskset", "-c", "1", "py", "-m"]
    assert fullstack.AppServer("py", shape, {}, tmp_path / "log").argv[0] == "py"
    monkeypatch.setattr(fullstack.os, "sched_getaffinity", lambda pid: {0})
    with pytest.raises(
        ValueError, match=r"--pin needs 2 CPUs at least, this process may use \[0\]"
    ):
        fullstack.pinned_cpus()


def test_pinned_wrk_runs_on_the_cpus_given(monkeypatch: pytest.MonkeyPatch) -> None:
    ran: list[list[str]] = []

    def fake_run(argv: list[str], **kwargs: Any) -> Any:
        ran.append(argv)
        return subprocess.CompletedProcess(argv, 0, stdout=WRK_404, stderr="")

    monkeypatch.setattr(fullstack_wrk.subprocess, "run", fake_run)
    figures = fullstack_wrk.run("http://h/x", connections=20, seconds=2, cpus="2,3")
    assert ran[0][:3] == ["taskset", "-c", "2,3"] and ran[0][3] == "wrk"
    assert figures["command"].startswith("taskset -c 2,3 wrk ")  # what ran, in the report
    fullstack_wrk.run("http://h/x", connections=20, seconds=2)
    assert ran[1][0] == "wrk"


def _spinner(seconds: float) -> subprocess.Popen[bytes]:
    """A process group of its own that burns CPU for ``seconds`` (forever if negative), then
    sleeps: a server still working through a run's backlog, then idle."""
    code = (
        "import time\nt = time.monotonic()\n"
        f"while {seconds} < 0 or time.monotonic() - t < {seconds}: pass\ntime.sleep(60)"
    )
    return subprocess.Popen([sys.executable, "-c", code], start_new_session=True)


def test_the_harness_waits_for_a_busy_server_to_go_idle_and_gives_up_past_its_bound() -> None:
    busy, spinning = _spinner(0.5), _spinner(-1)
    try:
        fullstack.wait_idle(busy.pid, timeout=30)
        assert busy.poll() is None  # idle, not gone
        assert fullstack.group_cpu_ticks(busy.pid) > 0  # it did burn CPU before going idle
        with pytest.raises(TimeoutError, match="still busy 1 s"):
            fullstack.wait_idle(spinning.pid, timeout=1)
    finally:
        for proc in (busy, spinning):
            proc.kill()
            proc.wait(10)


def test_the_sampler_counts_the_connections_opened_after_its_baseline_on_a_real_server(
    make_cluster: Any,
) -> None:
    import os

    import redis

    private = make_cluster(shards=1, replicas=1, sentinels=1)  # a replica link, a sentinel
    host, port = private.master_address(private.master_names[0])
    nodes = [(str(host), int(port))]
    baseline = fullstack.client_ids(nodes)
    app = [redis.Redis(host=host, port=port) for _ in range(3)]
    try:
        for client in app:
            client.ping()
        sampler = fullstack.NodeSampler(nodes, os.getpgid(0), baseline).start()
        deadline = time.monotonic() + 30
        while len(sampler.samples) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        held = sampler.stop()
    finally:
        for client in app:
            client.close()
    assert held["samples"] >= 2
    assert held["connections"] == 3 and held["per_node"] == {f"{host}:{port}": 3}
    assert held["rss_mb"] > 0  # this process group's RSS


def test_same_python_runs_every_contender_from_the_312_virtualenv(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from benchmarks import fullstack_env

    venv = "/nonexistent/fullstack-py312/bin/python"
    monkeypatch.setattr(fullstack_env, "py312", lambda log: venv)
    monkeypatch.setattr(fullstack_env, "install", lambda python, package, log: "9.9")
    monkeypatch.setattr(fullstack_env, "package_version", lambda python, package: "1.0")
    monkeypatch.setattr(fullstack_env, "python_version", lambda python: "3.12.1")
    ready, missing = fullstack.setup(
        ["ours_1", "django_vcache", "dr_default"], same_python=True, log=lambda message: None
    )
    assert missing == {}
    assert {cid: where["python"] for cid, where in ready.items()} == dict.fromkeys(ready, venv)
    ready, _ = fullstack.setup(["ours_1", "django_vcache"], same_python=False, log=print)
    assert ready["ours_1"]["python"] == fullstack_env.this_python()
    assert ready["django_vcache"]["python"] == venv
