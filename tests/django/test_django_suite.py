"""Django's own cache test suite (``BaseCacheTests`` from Django's source distribution, for the
installed Django version) must pass against this backend on a real 2-shard topology.

The sdist is downloaded once into ``.cache/sdists`` (git-ignored, see ``upstream_sdist``) and
reused; without it (no network) this test fails, it never skips.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import django
import pytest
from django_support import DJANGO_SUITE_DB, HERE
from upstream_sdist import SdistUnavailable, extract, sdist

import sentinel_cache
from sentinel_cache.testing import LocalSentinelCluster

SUITE_FILES = ("__init__.py", "models.py", "tests.py")
MIN_TESTS = 50


def django_sdist() -> Path:
    """The cached sdist of the installed Django; a failed download fails the test."""
    try:
        return sdist("django")
    except SdistUnavailable as exc:
        pytest.fail(str(exc))


def extract_suite(archive: Path, target: Path) -> None:
    """``tests/cache/{__init__,models,tests}.py`` into the package ``target/cache``."""
    package = target / "cache"
    package.mkdir()
    try:
        extract(archive, [f"tests/cache/{name}" for name in SUITE_FILES], package)
    except SdistUnavailable as exc:
        pytest.fail(str(exc))
    shutil.copy(HERE / "sharded_cache_suite.py", package / "tests_sharded.py")
    shutil.copy(HERE / "settings.py", target / "suite_settings.py")


def parse_unittest_output(output: str) -> dict[str, int]:
    ran = re.findall(r"^Ran (\d+) tests? in ", output, re.MULTILINE)
    status = re.findall(r"^(OK|FAILED)(?: \((.*)\))?\s*$", output, re.MULTILINE)
    assert ran and status, f"no unittest summary in the output:\n{output[-3000:]}"
    counts = {"ran": int(ran[-1]), "failures": 0, "errors": 0, "skipped": 0}
    for item in (status[-1][1] or "").split(","):
        if "=" in item:
            name, value = item.strip().split("=")
            counts[name] = int(value)
    counts["passed"] = (
        counts["ran"]
        - counts["failures"]
        - counts["errors"]
        - counts["skipped"]
        - counts.get("expected failures", 0)
        - counts.get("unexpected successes", 0)
    )
    return counts


def test_parse_unittest_output() -> None:
    ok = "....\n----\nRan 55 tests in 14.1s\n\nOK (skipped=3)\n"
    assert parse_unittest_output(ok) == {
        "ran": 55, "failures": 0, "errors": 0, "skipped": 3, "passed": 52,
    }  # fmt: skip
    bad = "Ran 55 tests in 1s\n\nFAILED (failures=1, errors=2, skipped=3)\n"
    assert parse_unittest_output(bad)["passed"] == 49


def test_djangos_cache_suite_passes(
    cluster: LocalSentinelCluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    extract_suite(django_sdist(), tmp_path)
    config = cluster.config()
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("DJANGO_")},
        # The suite, then the sentinel_cache under test (this checkout's, not an installed one).
        "PYTHONPATH": os.pathsep.join(
            [str(tmp_path), str(Path(sentinel_cache.__file__).parent.parent)]
        ),
        "DJANGO_SETTINGS_MODULE": "suite_settings",
        "SENTINEL_CACHE_DJANGO_SUITE": "1",
        "SENTINEL_CACHE_TEST_SENTINELS": ",".join(config["sentinels"]),
        "SENTINEL_CACHE_TEST_MASTERS": ",".join(config["masters"]),
        "SENTINEL_CACHE_TEST_DB": str(DJANGO_SUITE_DB),
        "SENTINEL_CACHE_TEST_PASSWORD": config["password"] or "",
        "SENTINEL_CACHE_TEST_SENTINEL_PASSWORD": config["sentinel_password"] or "",
    }
    done = subprocess.run(
        [sys.executable, "-m", "django", "test", "cache.tests_sharded", "--noinput", "-v", "2"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=150,
        check=False,
    )
    output = done.stdout + done.stderr
    counts = parse_unittest_output(output)
    with capsys.disabled():
        print(
            f"\nDjango {django.get_version()} cache suite on ShardedSentinelCache: "
            f"{counts['passed']} passed, {counts['skipped']} skipped, "
            f"{counts['failures']} failed, {counts['errors']} errors (ran {counts['ran']}, "
            "one of them our guard that both shards were used)"
        )
    assert counts["failures"] == 0 and counts["errors"] == 0, output[-6000:]
    assert done.returncode == 0, output[-6000:]
    assert counts["ran"] >= MIN_TESTS, output[-6000:]
