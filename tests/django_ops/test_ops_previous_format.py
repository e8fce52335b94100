"""``check --deploy`` W007 (issue 38, item 6): a ``PREVIOUS_CACHE`` that stores the same keys as
this cache in another value format is a warning, since during a rolling deploy a process still on
the old cache fails to read what this one wrote; the same keys in the same format, or other keys,
are not. Nothing connects (the entries point at a closed port)."""

from __future__ import annotations

import pickle
from typing import Any

import pytest
from django.core import checks
from ops_support import UseCaches, closed_port, sentinel_cache

from sentinel_cache.django.checks import check_previous_format

OLD_LOCATION = "redis://127.0.0.1:{port}/0"


def _old(backend: str, **options: Any) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "BACKEND": backend,
        "LOCATION": OLD_LOCATION.format(port=closed_port()),
    }
    if options:
        entry["OPTIONS"] = options
    return entry


DJANGO_REDIS = "django_redis.cache.RedisCache"
REDIS_CACHE = "django.core.cache.backends.redis.RedisCache"


def _ours(**options: Any) -> dict[str, Any]:
    return sentinel_cache([f"127.0.0.1:{closed_port()}"], PREVIOUS_CACHE="old", **options)


@pytest.mark.parametrize(
    ("old", "ours", "warned", "theirs"),
    [
        (_old(DJANGO_REDIS), _ours(), True, "pickle"),  # framed pickle: the b"\xfe" header
        (_old(REDIS_CACHE), _ours(SERIALIZER="json"), True, "pickle"),
        (_old(DJANGO_REDIS), _ours(VALUE_FORMAT="plain", SERIALIZER="pickle"), False, ""),
        (_old(REDIS_CACHE), _ours(VALUE_FORMAT="plain", SERIALIZER="pickle"), False, ""),
        (
            _old(DJANGO_REDIS, SERIALIZER="django_redis.serializers.json.JSONSerializer"),
            _ours(VALUE_FORMAT="plain", SERIALIZER="json"),
            False,
            "",
        ),
        (
            _old(DJANGO_REDIS, COMPRESSOR="django_redis.compressors.zlib.ZlibCompressor"),
            _ours(VALUE_FORMAT="plain", SERIALIZER="pickle"),
            True,
            "compressed",
        ),
        ({**_old(DJANGO_REDIS), "KEY_PREFIX": "old"}, _ours(), False, ""),  # other keys
        ({**_old(DJANGO_REDIS), "VERSION": 2}, _ours(), False, ""),
        ({"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}, _ours(), False, ""),
    ],
    ids=[
        "django-redis-vs-framed",
        "rediscache-vs-framed-json",
        "django-redis-vs-plain-pickle",
        "rediscache-vs-plain-pickle",
        "json-vs-plain-json",
        "compressed-vs-plain-pickle",
        "other-prefix",
        "other-version",
        "locmem",
    ],
)
def test_w007_only_for_the_same_keys_in_another_format(
    use_caches: UseCaches, old: dict[str, Any], ours: dict[str, Any], warned: bool, theirs: str
) -> None:
    use_caches(old=old, sessions=ours)
    messages = check_previous_format(None)
    if not warned:
        assert messages == []
        return
    (warning,) = messages
    assert warning.id == "sentinel_cache.W007" and warning.level == checks.WARNING
    assert warning.obj == "sessions"
    assert "PREVIOUS_CACHE 'old' stores the same keys as this cache" in warning.msg
    assert f"in another value format ({theirs}; this cache: VALUE_FORMAT " in warning.msg
    assert "UnpicklingError: invalid load key, '\\xfe'" in warning.msg
    assert "KEY_PREFIX" in (warning.hint or "") and "VALUE_FORMAT" in (warning.hint or "")


def test_the_framed_format_is_what_pickle_refuses() -> None:
    """The failure W007 predicts: django-redis's pickle load of a framed value."""
    from sentinel_cache.core.serializers import Codec

    framed = Codec("pickle").dumps({"name": "Ada"})
    with pytest.raises(pickle.UnpicklingError, match=r"invalid load key, '\\xfe'"):
        pickle.loads(framed)
