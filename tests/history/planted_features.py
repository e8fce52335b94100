"""Planted faults of the feature scenarios (tests/history/test_history_features.py): each a
factory ``(original) -> replacement`` named in a scenario's ``patches``, installed only in the
client processes of the test that proves the scenario can fail (never in shipped code)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def previous_not_consulted(original: Callable[..., Any]) -> Callable[..., Any]:
    """``Moves._drop_previous`` that drops nothing: the previous owner's copy survives a write
    or a delete through the new ring, to be read (and moved) back."""

    def keep(self: Any, keys: Any) -> int:
        return 0

    return keep


def tombstones_off(original: Callable[..., Any]) -> Callable[..., Any]:
    """``ClientBase.del_commands`` that sends the plain delete without ``DELETE_MARKED``: no
    tombstone, so a copy read from the previous owner before the delete lands after it."""

    def plain(self: Any, keys: Any, command: str = "DEL") -> list[tuple[Any, ...]]:
        return [(command, *keys)]

    return plain


def invalidations_ignored(original: Callable[..., Any]) -> Callable[..., Any]:
    """``NearCache.invalidate`` that evicts nothing: the server's invalidations of another
    process's writes are dropped, and the copies kept here are served on."""

    def ignore(self: Any, index: int, keys: Any) -> None:
        return None

    return ignore


def copy_delayed(original: Callable[..., Any]) -> Callable[..., Any]:
    """``Moves._restore`` (a read's copy onto the owner) sent 300 ms late: widens the window a
    tombstone closes (a copy read before a delete landing after it) so that a run of seconds
    meets it on many moving keys (at 100 ms a loaded CI run met it on none: 1,354 ops, 0
    violations). Only with another planted fault: alone it breaks nothing."""
    import time

    def late(self: Any, *args: Any, **kwargs: Any) -> Any:
        time.sleep(0.3)
        return original(self, *args, **kwargs)

    return late


def no_recheck(original: Callable[..., Any]) -> Callable[..., Any]:
    """``Adopter.adopt`` with ``recheck`` always off (issue 36 item 1's fix reverted): a reader
    that missed on ours and on the old cache does not look at ours again, though a concurrent
    reader moved the key between its two reads."""

    def adopt(self: Any, previous: Any, keys: Any, **kwargs: Any) -> Any:
        kwargs["recheck"] = False
        return original(self, previous, keys, **kwargs)

    return adopt


def forget_then_wait(original: Callable[..., Any]) -> Callable[..., Any]:
    """``Adopter.forget`` (a write's delete of the old copy, before it writes ours) followed
    by 50 ms: widens the window between the two steps of a write while ``PREVIOUS_CACHE`` is
    set, so that a run of seconds meets it. Changes no outcome, only when the next step runs."""
    import time

    def forget(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = original(self, *args, **kwargs)
        time.sleep(0.05)
        return result

    return forget


def adopt_late(original: Callable[..., Any]) -> Callable[..., Any]:
    """``Adopter.adopt`` (a reader's look at the old cache, after its miss here) 20 ms late:
    widens the window in which another reader moves the key, so that the recheck's absence
    (:func:`no_recheck`) shows in a run of seconds. Changes no outcome by itself."""
    import time

    def adopt(self: Any, *args: Any, **kwargs: Any) -> Any:
        time.sleep(0.02)
        return original(self, *args, **kwargs)

    return adopt


def old_delete_fails_open(original: Callable[..., Any]) -> Callable[..., Any]:
    """``Adopter.forget`` whose failure is swallowed: a write or delete acknowledged though the
    old cache could not delete its copy, as when django-redis's ``IGNORE_EXCEPTIONS`` answered
    for it (issue 36's fail-open finding, fixed: such a write now fails). The old copy then
    outlives the acknowledged delete, to be read (and adopted) back."""

    def forget(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return original(self, *args, **kwargs)
        except Exception:
            return None

    return forget


#: ``COPY_MISSING`` without its guard: every key SET whatever ours holds (a newer value, a
#: tombstone, the clear mark), same arguments (deadline, then data and ttl_ms per key).
COPY_OVER = """
local done = {}
for i, key in ipairs(KEYS) do
    local ttl = ARGV[2 * i + 1]
    if ttl == '0' then
        redis.call('SET', key, ARGV[2 * i])
    else
        redis.call('SET', key, ARGV[2 * i], 'PX', ttl)
    end
    done[i] = 1
end
return done
"""


def copies_over(original: Callable[..., Any]) -> Callable[..., Any]:
    """``previous._copies`` (the migration's copies) with the guard off: a value read from the
    old cache is written over a newer write on ours, and over a delete since (its tombstone)."""

    def copies(items: Any, deadline: int) -> Any:
        commands = original(items, deadline)
        return [
            ("EVAL", COPY_OVER, *command[2:]) if command[0] == "EVAL" else command
            for command in commands
        ]

    return copies


def written_late(original: Callable[..., Any]) -> Callable[..., Any]:
    """``Adopter._written`` (a batch's copies, after its read of the old cache) 100 ms late:
    widens the window in which a client writes or deletes a key the batch read, so that a run
    of seconds meets it. Changes no outcome by itself."""
    import time

    def written(self: Any, *args: Any, **kwargs: Any) -> Any:
        time.sleep(0.1)
        return original(self, *args, **kwargs)

    return written


def hangs(original: Callable[..., Any]) -> Callable[..., Any]:
    """``Adopter._written`` that never returns (an hour's sleep): a migration stuck inside a
    batch, for the test that a stuck migration fails its scenario with its stacks."""
    import time

    def stuck(self: Any, *args: Any, **kwargs: Any) -> Any:
        time.sleep(3600)
        return original(self, *args, **kwargs)

    return stuck
