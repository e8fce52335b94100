"""Django's own cache test suite (``BaseCacheTests`` from Django's source distribution, for the
installed Django version) must pass against this backend on a real 2-shard topology.

The sdist is downloaded once into ``.cache/django-sdist`` (git-ignored) and reused; without it
(no network) this test fails, it never skips.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import django
import pytest
from django_support import DJANGO_SUITE_DB, HERE

from sentinel_cache.testing import LocalSentinelCluster

ROOT = HERE.parent.parent
SDIST_DIR = ROOT / ".cache" / "django-sdist"
SUITE_FILES = ("__init__.py", "models.py", "tests.py")
MIN_TESTS = 50


def django_sdist() -> Path:
    """The cached sdist of the installed Django, downloaded with pip if missing (one retry)."""
    version = django.get_version()
    names = (f"django-{version}.tar.gz", f"Django-{version}.tar.gz")
    SDIST_DIR.mkdir(parents=True, exist_ok=True)
    command = [
        sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
        "--disable-pip-version-check", "--timeout", "30", "--dest", str(SDIST_DIR),
        f"django=={version}",
    ]  # fmt: skip
    outputs: list[str] = []
    for attempt in range(2):
        for name in names:
            if (SDIST_DIR / name).is_file():
                return SDIST_DIR / name
        if attempt:
            time.sleep(2)
        done = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)
        outputs.append(f"exit {done.returncode}: {done.stdout[-1500:]}{done.stderr[-1500:]}")
    for name in names:
        if (SDIST_DIR / name).is_file():
            return SDIST_DIR / name
    pytest.fail(
        f"could not download Django {version}'s sdist into {SDIST_DIR}:\n" + "\n".join(outputs)
    )


def extract_suite(sdist: Path, target: Path) -> None:
    """``tests/cache/{__init__,models,tests}.py`` into the package ``target/cache``."""
    package = target / "cache"
    package.mkdir()
    with tarfile.open(sdist) as archive:
        for member in archive.getmembers():
            parts = Path(member.name).parts
            if len(parts) == 4 and parts[1:3] == ("tests", "cache") and parts[3] in SUITE_FILES:
                source = archive.extractfile(member)
                assert source is not None
                (package / parts[3]).write_bytes(source.read())
    missing = [name for name in SUITE_FILES if not (package / name).is_file()]
    assert not missing, f"{sdist.name} has no tests/cache/{missing}"
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
        "PYTHONPATH": str(tmp_path),
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
