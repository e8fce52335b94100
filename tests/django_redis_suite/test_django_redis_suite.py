"""django-redis's own test suite against ``ShardedSentinelCache`` on a real 2-shard topology.

A django-redis team switching to this backend runs code written against django-redis; its own
tests are the fairest measure of how much of it carries over. The test files of the installed
django-redis (``tests/test_backend.py``, ``test_backend_sorted_sets.py``,
``test_cache_options.py``, ``test_session.py``) come from its source distribution (downloaded
once into ``.cache/sdists`` by ``upstream_sdist``; without it this test fails, it never skips)
and run with pytest in a subprocess (their ``cache`` fixture calls ``django.setup()`` on a
settings module of its own, which this process, already configured, cannot do). Upstream's
conftest is replaced by ``upstream_conftest.py`` (the same fixtures, one settings module:
``upstream_settings.py``, upstream's ``sqlite.py`` translated as docs/migration.md says).

Every upstream test must pass unless :data:`KNOWN_FAILURES` names it with the reason; an entry
that passes fails this test too, so the table can only shrink as the backend gains the API.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ElementTree
from collections import Counter
from pathlib import Path

import django_redis
import pytest
from upstream_sdist import SdistUnavailable, extract, sdist

import sentinel_cache
from sentinel_cache.testing import LocalSentinelCluster
from sentinel_cache.testing.processes import free_ports

HERE = Path(__file__).resolve().parent
MEASURED_ON = "7.0.0"  # the django-redis whose suite KNOWN_FAILURES and MIN_TESTS describe
DJANGO_REDIS_SUITE_DB = 4  # a database of its own: its cache fixture's clear() flushes it
SUITE_FILES = (
    "test_backend.py",
    "test_backend_sorted_sets.py",
    "test_cache_options.py",
    "test_session.py",
)
# How many tests each file holds in MEASURED_ON: a file that collects fewer (an import
# error, a renamed fixture) fails this test rather than passing with fewer tests.
MIN_TESTS = {
    "test_backend.py": 95,
    "test_backend_sorted_sets.py": 28,
    "test_cache_options.py": 8,
    "test_session.py": 35,
}

INTERNALS = "reads django-redis internals"
MISSING = "missing API"

#: Upstream test id -> why it does not pass here: "reads django-redis internals: <what>" stays
#: (a test of how django-redis is built, not of what a project calls); "missing API: <name>
#: (issue 24)" goes as the backend gains that API.
KNOWN_FAILURES: dict[str, str] = {
    "test_backend.py::TestDjangoRedisCache::test_save_dict": f"{INTERNALS}: cache.client._serializer",
    "test_backend.py::TestDjangoRedisCache::test_intenum": f"{INTERNALS}: cache.client._serializer",
    "test_backend.py::TestDjangoRedisCache::test_sscan_with_match": f"{INTERNALS}: cache.client._has_compression_enabled()",
    "test_backend.py::TestDjangoRedisCache::test_sscan_iter_with_match": f"{INTERNALS}: cache.client._has_compression_enabled()",
    "test_backend.py::TestDjangoRedisCache::test_set_call_empty_pipeline": f"{INTERNALS}: cache.client.get_client(write=True) of the one server, set(client=pipeline), client.encode and client._backend",
    "test_backend.py::TestDjangoRedisCache::test_primary_replica_switching": f"{INTERNALS}: client._server and client._clients, get_client(write=...) of the one server",
    "test_backend.py::TestDjangoRedisCache::test_primary_replica_switching_with_index": f"{INTERNALS}: client.get_client_with_index()",
    "test_backend.py::TestDjangoRedisCache::test_hash_key_structure_in_redis": f"{INTERNALS}: cache.client.get_client(write=False) of the one server, cache.client.make_key",
    "test_backend.py::TestDjangoRedisCache::test_delete_pattern_with_custom_count": f"{INTERNALS}: patches django_redis.cache.RedisCache.client (our backend is no RedisCache)",
    "test_backend.py::TestDjangoRedisCache::test_delete_pattern_with_settings_default_scan_count": f"{INTERNALS}: patches django_redis.cache.RedisCache.client (our backend is no RedisCache)",
    "test_backend.py::TestDjangoRedisCache::test_close_with_signal_parameter": f"{INTERNALS}: patches django_redis.cache.RedisCache.client (our backend is no RedisCache)",
    "test_backend.py::TestDjangoRedisCache::test_close_client": f"{INTERNALS}: cache.close() calling cache.client.close() (ours does nothing: the core is shared)",
    "test_cache_options.py::test_get_django_omit_exceptions_many_returns_default_arg": f"{INTERNALS}: cache._ignore_exceptions",
    "test_cache_options.py::test_get_django_omit_exceptions": f"{INTERNALS}: cache._ignore_exceptions, cache._log_ignored_exceptions, and django-redis's own log record (ERROR 'Exception ignored'; ours is a warning naming the shard)",
    "test_cache_options.py::test_get_django_omit_exceptions_priority_1": f"{INTERNALS}: cache._ignore_exceptions",
    "test_cache_options.py::test_get_django_omit_exceptions_priority_2": f"{INTERNALS}: cache._ignore_exceptions",
    "test_cache_options.py::test_custom_key_function": f"{INTERNALS}: cache.client.get_client(write=False) of the one server, REVERSE_KEY_FUNCTION",
}


def django_redis_sdist() -> Path:
    """The cached sdist of the installed django-redis; a failed download fails the test."""
    try:
        return sdist("django-redis")
    except SdistUnavailable as exc:
        pytest.fail(str(exc))


def extract_suite(archive: Path, target: Path) -> None:
    """Upstream's test files into the package ``target/tests``, with our conftest and settings."""
    tests = target / "tests"
    (tests / "settings").mkdir(parents=True)
    wanted = ["__init__.py", "settings_wrapper.py", *SUITE_FILES]
    try:
        extract(archive, [f"tests/{name}" for name in wanted], tests)
    except SdistUnavailable as exc:
        pytest.fail(str(exc))
    (tests / "settings" / "__init__.py").write_text("")
    shutil.copy(HERE / "upstream_conftest.py", tests / "conftest.py")
    shutil.copy(HERE / "upstream_settings.py", tests / "settings" / "sentinel_cache.py")
    (target / "pytest.ini").write_text("[pytest]\nxfail_strict = true\n")


def upstream_id(classname: str, name: str) -> str:
    """``tests.test_backend.TestX`` + ``test_y[sentinel_cache]`` ->
    ``test_backend.py::TestX::test_y`` (one settings module, so the parameter is dropped)."""
    parts = classname.split(".")
    assert parts[0] == "tests" and len(parts) >= 2, classname
    return "::".join([f"{parts[1]}.py", *parts[2:], name.split("[", 1)[0]])


def parse_junit(path: Path) -> dict[str, tuple[str, str]]:
    """Test id -> (outcome, first line of its message); the outcome is ``passed``,
    ``failed``, ``error`` (in a fixture) or ``skipped``."""
    outcomes: dict[str, tuple[str, str]] = {}
    for case in ElementTree.parse(path).getroot().iter("testcase"):
        outcome, message = "passed", ""
        for kind in ("skipped", "failure", "error"):  # the worst one found wins
            element = case.find(kind)
            if element is not None:
                outcome = {"failure": "failed"}.get(kind, kind)
                message = (element.get("message") or "").split("\n", 1)[0][:200]
        identity = upstream_id(case.get("classname", ""), case.get("name", ""))
        assert identity not in outcomes, f"{identity} reported twice"
        outcomes[identity] = (outcome, message)
    return outcomes


def test_parse_junit(tmp_path: Path) -> None:
    report = tmp_path / "report.xml"
    report.write_text(
        '<testsuites><testsuite name="pytest">'
        '<testcase classname="tests.test_backend.TestDjangoRedisCache" name="test_a[sentinel_cache]"/>'
        '<testcase classname="tests.test_backend.TestDjangoRedisCache" name="test_b[sentinel_cache]">'
        '<failure message="AssertionError: x&#10;more">trace</failure></testcase>'
        '<testcase classname="tests.test_cache_options" name="test_c">'
        '<failure message="f"/><error message="teardown"/></testcase>'
        '<testcase classname="tests.test_session" name="test_d[sentinel_cache]">'
        '<skipped message="why"/></testcase>'
        "</testsuite></testsuites>"
    )
    assert parse_junit(report) == {
        "test_backend.py::TestDjangoRedisCache::test_a": ("passed", ""),
        "test_backend.py::TestDjangoRedisCache::test_b": ("failed", "AssertionError: x"),
        "test_cache_options.py::test_c": ("error", "teardown"),
        "test_session.py::test_d": ("skipped", "why"),
    }


def test_known_failures_are_reasoned() -> None:
    """Every entry names an upstream file and a reason of one of the two kinds."""
    for identity, reason in KNOWN_FAILURES.items():
        assert identity.split("::", 1)[0] in SUITE_FILES, identity
        kind, _, what = reason.partition(": ")
        assert kind in (INTERNALS, MISSING) and what, (identity, reason)
        assert kind != MISSING or what.endswith("(issue 24)"), (identity, reason)


def test_django_redis_suite(
    cluster: LocalSentinelCluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert django_redis.__version__ == MEASURED_ON, (
        f"KNOWN_FAILURES and MIN_TESTS describe django-redis {MEASURED_ON}'s suite, but "
        f"{django_redis.__version__} is installed: run this test and measure the table again"
    )
    extract_suite(django_redis_sdist(), tmp_path)
    config = cluster.config()
    (dead_port,) = free_ports(1)
    # Our sentinel_cache (this checkout's, wherever pytest imported it from), then the suite's.
    ours = str(Path(sentinel_cache.__file__).resolve().parent.parent)
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("DJANGO_")},
        "PYTHONPATH": os.pathsep.join([str(tmp_path), ours]),
        "SENTINEL_CACHE_TEST_SENTINELS": ",".join(config["sentinels"]),
        "SENTINEL_CACHE_TEST_MASTERS": ",".join(config["masters"]),
        "SENTINEL_CACHE_TEST_DB": str(DJANGO_REDIS_SUITE_DB),
        "SENTINEL_CACHE_TEST_PASSWORD": config["password"] or "",
        "SENTINEL_CACHE_TEST_SENTINEL_PASSWORD": config["sentinel_password"] or "",
        "SENTINEL_CACHE_TEST_DEAD_SENTINEL": f"127.0.0.1:{dead_port}",
    }
    report = tmp_path / "report.xml"
    command = [
        sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:django",
        "-p", "no:valkey", "--rootdir", str(tmp_path), "-c", str(tmp_path / "pytest.ini"),
        "--timeout", "30", f"--junitxml={report}", *(f"tests/{name}" for name in SUITE_FILES),
    ]  # fmt: skip
    done = subprocess.run(
        command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240, check=False
    )
    output = done.stdout + done.stderr
    assert report.exists(), output[-6000:]
    outcomes = parse_junit(report)

    counts: dict[str, Counter[str]] = {name: Counter() for name in SUITE_FILES}
    for identity, (outcome, _) in outcomes.items():
        counts[identity.split("::", 1)[0]][outcome] += 1
    with capsys.disabled():
        print(f"\ndjango-redis {django_redis.__version__}'s own suite on ShardedSentinelCache:")
        for name, found in counts.items():
            print(
                f"  {name}: {found['passed']} of {sum(found.values())} passed"
                f" ({found['failed']} failed, {found['error']} errors, {found['skipped']} skipped)"
            )
        kinds = Counter(reason.partition(": ")[0] for reason in KNOWN_FAILURES.values())
        print(f"  known failures: {dict(kinds)}")

    for name, least in MIN_TESTS.items():
        assert sum(counts[name].values()) >= least, (name, counts[name], output[-6000:])
    unexpected = {
        identity: found
        for identity, found in outcomes.items()
        if found[0] != "passed" and identity not in KNOWN_FAILURES
    }
    now_passing = [
        identity for identity in KNOWN_FAILURES if outcomes.get(identity, ("",))[0] == "passed"
    ]
    vanished = [identity for identity in KNOWN_FAILURES if identity not in outcomes]
    assert not unexpected, "failing, not in KNOWN_FAILURES:\n" + "\n".join(
        f"  {identity}: {outcome}: {message}" for identity, (outcome, message) in unexpected.items()
    )
    assert not now_passing, f"passing now, drop them from KNOWN_FAILURES: {now_passing}"
    assert not vanished, f"in KNOWN_FAILURES but not run: {vanished}"
