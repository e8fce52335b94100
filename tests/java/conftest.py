"""Fixtures for tests/java/: the jar folder (a skip, allowed outside CI only, without it) and the
Jedis 2.9.0 driver compiled once per session (CPU is scarce)."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from jedis_support import SKIP_SAYS, WHERE, classpath, compile_java, jedis_dir
from minimal_django import configure_django


@pytest.fixture(scope="session")
def jars() -> Path:
    folder = jedis_dir()
    if folder is None:
        pytest.skip(f"{SKIP_SAYS} ({WHERE}); none found")
    for tool in ("javac", "java"):
        if shutil.which(tool) is None:
            pytest.skip(f"{SKIP_SAYS} and a JDK: no {tool} on PATH (Java 17 works)")
    return folder


@pytest.fixture(scope="session")
def sharded_driver(jars: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The classpath of tests/java/ShardedDriver.java, compiled once against Jedis 2.9.0."""
    into = tmp_path_factory.mktemp("jedis-2.9.0")
    compile_java(
        Path(__file__).with_name("ShardedDriver.java"),
        "ShardedDriver",
        classpath(jars, "2.9.0"),
        into,
    )
    yield classpath(jars, "2.9.0", into)


@pytest.fixture(scope="session", autouse=True)
def _django() -> None:
    configure_django()
