"""Planted faults for the tests that prove the net can fail: each is a factory
``(original) -> replacement`` named in a scenario's ``patches`` and installed only in the
client processes of that test (never in shipped code)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def skipped(original: Callable[..., Any]) -> Callable[..., Any]:
    """The step does nothing (e.g. ``Shard.raise_fence``: the write fence is never raised)."""

    def nothing(*args: Any, **kwargs: Any) -> None:
        return None

    return nothing


def trusted(original: Callable[..., Any]) -> Callable[..., Any]:
    """``ShardBound._untrusted_reply`` that trusts every reply: an old master's late
    acknowledgement counts, though the shard switched (or promoted a replica) meanwhile."""

    def every_reply(self: Any) -> None:
        return None

    return every_reply


def exists_instead_of_del(original: Callable[..., Any]) -> Callable[..., Any]:
    """``ClientBase.del_commands`` that sends ``EXISTS`` instead of ``DEL``: every delete is
    acknowledged (True where the key existed) and deletes nothing, as a skipped tombstone or a
    previous owner's copy left behind would."""

    def commands(self: Any, keys: Any, command: str = "DEL") -> list[tuple[Any, ...]]:
        return [("EXISTS", *keys)]

    return commands
