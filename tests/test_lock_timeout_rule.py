"""A stampede lock's timeout follows one rule (``arguments.number_problem``), whether it comes
from ``get_or_set(lock_timeout=...)`` or from the ``STAMPEDE_LOCK_TIMEOUT`` option: the same
values pass, the same are refused, each error naming its field and value before anything is
sent."""

from __future__ import annotations

import math
from typing import Any

import pytest

from sentinel_cache import ArgumentValueError, ConfigurationError
from sentinel_cache.core.arguments import MAX_TIMEOUT
from sentinel_cache.core.config import parse_cache_config
from sentinel_cache.core.ops._sync.stampede import valid_lock_timeout
from sentinel_cache.core.ops.client import CacheClient
from sentinel_cache.core.serializers import Codec
from sentinel_cache.core.topology.sharded_pool import ShardedSentinelPool

REFUSED = [0, 0.0005, -1, math.nan, math.inf, -math.inf, True, "10", None, MAX_TIMEOUT * 2]
ACCEPTED = [0.001, 1, 2.5, 10, MAX_TIMEOUT]


def option_refuses(value: Any) -> bool:
    try:
        parse_cache_config(["127.0.0.1:1"], {"MASTERS": ["a"], "STAMPEDE_LOCK_TIMEOUT": value})
    except ConfigurationError as exc:
        assert exc.option == "STAMPEDE_LOCK_TIMEOUT"
        assert repr(value) in str(exc)
        return True
    return False


def argument_refuses(value: Any) -> bool:
    try:
        valid_lock_timeout(value)
    except ArgumentValueError as exc:
        assert "lock_timeout" in str(exc) and repr(value) in str(exc)
        return True
    return False


@pytest.mark.parametrize("value", REFUSED, ids=repr)
def test_both_refuse(value: Any) -> None:
    assert argument_refuses(value)
    assert option_refuses(value)


@pytest.mark.parametrize("value", ACCEPTED, ids=repr)
def test_both_accept(value: Any) -> None:
    assert not argument_refuses(value)
    assert not option_refuses(value)
    assert valid_lock_timeout(value) == float(value)


@pytest.mark.parametrize("value", [0, math.nan, "10"], ids=repr)
def test_get_or_set_refuses_before_sending_anything(value: Any) -> None:
    """No sentinel listens on port 1: had the call gone out, discovery would fail instead."""
    pool = ShardedSentinelPool(["a"], ["127.0.0.1:1"])
    try:
        client = CacheClient(pool, Codec())
        with pytest.raises(ArgumentValueError, match="lock_timeout"):
            client.get_or_set("key", lambda: 1, 60, lock_timeout=value)
        assert not pool.started
    finally:
        pool.close()
