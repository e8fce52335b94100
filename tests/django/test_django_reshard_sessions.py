"""Resharding (issue 22): a logout is final while PREVIOUS_MASTERS is set. Django cache
sessions written under the old placement, flushed (logged out) one by one under the new one while
two readers load them: afterwards no flushed session loads. Real servers, Django's own
SessionStore."""

from __future__ import annotations

import threading
from typing import Any

from django.contrib.sessions.backends.cache import KEY_PREFIX, SessionStore
from django_support import build_cache, cache_entry, remember, unique_prefix

from sentinel_cache.django import ShardedSentinelCache
from sentinel_cache.testing import LocalSentinelCluster

BEFORE, AFTER = ["shard0", "shard1"], ["shard0", "shard1", "shard2"]  # a master appended


def store(cache: ShardedSentinelCache, session_key: str | None = None) -> SessionStore:
    """Django's cache SessionStore on ``cache`` (instead of the SESSION_CACHE_ALIAS one)."""
    session = SessionStore(session_key)
    session._cache = cache
    return session


def test_logouts_racing_readers_are_not_undone(three: LocalSentinelCluster) -> None:
    prefix = unique_prefix()

    def backend(masters: list[str], **options: Any) -> ShardedSentinelCache:
        entry = cache_entry(three, KEY_PREFIX=prefix, OPTIONS={"MASTERS": masters, **options})
        return remember(build_cache(entry))

    old, new = backend(BEFORE), backend(AFTER, PREVIOUS_MASTERS=BEFORE)
    sessions: list[str] = []
    while len(sessions) < 300:  # logged in under the old placement, each session moving
        session = store(old)
        session["_auth_user_id"] = str(len(sessions))
        session.save()
        final = new.make_key(KEY_PREFIX + session.session_key)  # type: ignore[operator]
        if new.core.previous_shard_for(final) is not None:
            sessions.append(session.session_key)  # type: ignore[arg-type]
    at = [0]
    done = threading.Event()
    outcomes: dict[str, Any] = {}

    def read(name: str) -> None:
        loads = 0
        try:
            while not done.is_set():
                store(new, sessions[at[0]]).load()
                loads += 1
            outcomes[name] = loads
        except BaseException as exc:
            outcomes[name] = exc

    readers = [threading.Thread(target=read, args=(f"reader{n}",)) for n in range(2)]
    try:
        for reader in readers:
            reader.start()
        for i, session_key in enumerate(sessions):
            at[0] = i
            session = store(new, session_key)
            assert session.get("_auth_user_id") == str(i)  # logged in
            session.flush()  # the logout
        done.set()
        for reader in readers:
            reader.join(60)
        assert not any(reader.is_alive() for reader in readers)
        assert all(isinstance(n, int) and n > 0 for n in outcomes.values()), outcomes
        undone = [key for key in sessions if store(new, key).get("_auth_user_id") is not None]
        print(f"{len(undone)} of {len(sessions)} logouts undone; {outcomes}")
        assert undone == []
    finally:
        done.set()
