"""The lean read paths (sync and asyncio) raise a reply the parser hands for an unusable
connection as a socket failure: one rule, ``lean_rules.broken``, for both. redis-py's parser
maps ``-LOADING`` to ``BusyLoadingError`` (a ``ConnectionError``) and returns it as the reply,
alone or first of a transaction's list; an ordinary error reply is not a broken connection."""

from __future__ import annotations

from redis.exceptions import BusyLoadingError, ReadOnlyError, ResponseError

from sentinel_cache.core.topology.lean_rules import broken


def test_a_connection_error_reply_is_broken_alone_or_first_of_a_list() -> None:
    loading = BusyLoadingError("Redis is loading the dataset in memory")
    assert broken(loading) is loading
    assert broken([loading, b"OK"]) is loading


def test_data_and_error_replies_are_not() -> None:
    for reply in (b"v", None, 3, [], [b"OK", BusyLoadingError("late")], ResponseError("ERR x")):
        assert broken(reply) is None
    assert broken(ReadOnlyError("READONLY")) is None  # the read path drops the socket itself
