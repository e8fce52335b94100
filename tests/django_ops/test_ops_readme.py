"""The README's quick start (issue 38): its ``@cache_page(60)`` view and URL snippet, taken from
the page, serve a response cached in the sharded cache; its install line from a checkout names
the extras the project declares. (README.md is not under docs/, so tests/test_docs.py does not
run it.)"""

from __future__ import annotations

import re
import sys
import types
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.core.cache import caches
from django.test import Client, override_settings
from ops_support import UseCaches, cluster_cache

from sentinel_cache.testing import LocalSentinelCluster

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text(encoding="utf-8")
_PYTHON = re.compile(r"^```python\n(?P<code>.*?)^```$", re.S | re.M)


def _block(first_line: str) -> str:
    (code,) = [m["code"] for m in _PYTHON.finditer(README) if m["code"].startswith(first_line)]
    return code


@pytest.fixture
def mysite() -> Iterator[None]:
    """``mysite.views`` and ``mysite.urls`` made from the README's two blocks."""
    package = types.ModuleType("mysite")
    package.__path__ = []
    sys.modules["mysite"] = package
    try:
        for name in ("views", "urls"):
            module = types.ModuleType(f"mysite.{name}")
            sys.modules[module.__name__] = module
            setattr(package, name, module)
            exec(
                compile(_block(f"# mysite/{name}.py"), f"README.md:mysite/{name}.py", "exec"),
                module.__dict__,
            )
        yield
    finally:
        for name in ("mysite.urls", "mysite.views", "mysite"):
            sys.modules.pop(name, None)


def test_the_readme_view_is_cached_in_the_sharded_cache(
    cluster: LocalSentinelCluster, use_caches: UseCaches, mysite: None
) -> None:
    use_caches(default=cluster_cache(cluster))
    cache = caches["default"]
    with override_settings(ROOT_URLCONF="mysite.urls", ALLOWED_HOSTS=["testserver"]):
        first = Client().get("/hello/")
        assert first.status_code == 200 and first.content == b"Hello from the sharded cache"
        assert "max-age=60" in first["Cache-Control"]
        stored = list(cache.iter_keys("views.decorators.cache.cache_page.*"))
        assert stored, "cache_page stored nothing in the sharded cache"
        assert all(0 < cache.ttl(key) <= 60 for key in stored)
        sys.modules["mysite.views"].HttpResponse = None  # a second render would fail
        second = Client().get("/hello/")
        assert second.status_code == 200 and second.content == first.content  # from the cache
    cache.delete_many(stored)


def test_the_install_lines_name_declared_extras() -> None:
    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    declared = pyproject.split("[project.optional-dependencies]")[1]
    extras = set(re.findall(r"^(\w+) = \[", declared, re.M))
    assert {"django", "flask", "embedded"} <= extras, extras
    assert 'pip install -e ".[django,embedded]"' in README and ".[flask,embedded]" in README
    assert 'pip install "sentinel-cache[django,embedded]"' in README  # after the release
    for page in ("docs/quickstart.md", "docs/install.md"):
        text = " ".join((ROOT / page).read_text(encoding="utf-8").split())
        assert (
            "install from a checkout of the repository instead, with the same extras: `pip "
            'install -e ".[django,embedded]"`' in text
        ), page
