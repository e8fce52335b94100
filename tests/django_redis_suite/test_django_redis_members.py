"""The stand-in for django-redis's serializer that tests/django uses (those tests also run in
matrix cells without django-redis): it stores exactly the bytes django-redis's own default
``PickleSerializer`` does, for values and members alike."""

from __future__ import annotations

import pickle
from typing import Any

import pytest
from django_redis.serializers.pickle import PickleSerializer

from sentinel_cache.core.serializers import Codec


@pytest.mark.parametrize("value", ["ada", ("t", 1), {"k": [1, 2.5]}, b"raw", 2**70, None])
def test_the_stand_in_and_the_plain_codec_store_what_django_redis_stores(value: Any) -> None:
    theirs = PickleSerializer(options={}).dumps(value)
    assert pickle.dumps(value, pickle.DEFAULT_PROTOCOL) == theirs
    assert Codec("pickle", value_format="plain").dumps(value) == theirs
    assert (
        PickleSerializer(options={}).loads(Codec("pickle", value_format="plain").dumps(value))
        == value
    )
