"""Django sessions as history ops (issue 35, phase 2a): ``SessionStore`` of the cache session
engine over the history's cache alias, through the ``"django"`` adapter. A session is a
register (its key; the value: the unique marker its last save stored), so the checker's rules
read as the session's promises: a saved session is loadable with its last acknowledged data
(``stale-read``) until it is flushed; a flushed session never comes back (``delete-undone``);
no load returns data nobody saved there (``phantom``).

Importing this module registers the ops in :data:`~history.recorder.OPS` (weight 0). The
session keys live in each client process (its threads share them).
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable
from typing import Any

from .ops_structures import shaped
from .recorder import INFO, OK, OPS, Delete, Op, OpSpec, Read, Workload, Write

Fresh = Callable[[], str]

_lock = threading.Lock()
_sessions: list[str] = []  # keys this process created (flushed ones too: loads must miss)


def _store(key: str | None = None) -> Any:
    from django.conf import settings
    from django.contrib.sessions.backends.cache import SessionStore

    settings.SESSION_CACHE_ALIAS = "history"  # the adapter's alias, in this client process
    return SessionStore(session_key=key)


def _pick(rng: random.Random, fresh: Fresh) -> tuple[str, ...]:
    with _lock:
        if _sessions:
            return (_sessions[-rng.randrange(1, min(len(_sessions), 20) + 1)],)
    return ()


def _new(rng: random.Random, w: Workload, fresh: Fresh) -> tuple[tuple[str, ...], tuple[Any, ...]]:
    return (), (fresh(),)


def _existing(
    rng: random.Random, w: Workload, fresh: Fresh
) -> tuple[tuple[str, ...], tuple[Any, ...]]:
    return _pick(rng, fresh), (fresh(),)


def _existing_key(
    rng: random.Random, w: Workload, fresh: Fresh
) -> tuple[tuple[str, ...], tuple[Any, ...]]:
    return _pick(rng, fresh), ()


def create(a: Any, keys: tuple[str, ...], args: tuple[Any, ...]) -> dict[str, Any]:
    """A new session holding ``args[0]`` (``save()`` of a fresh store: ``cache.add``)."""
    store = _store()
    store["v"] = args[0]
    store.save()
    with _lock:
        _sessions.append(store.session_key)
    return {"key": store.session_key}


def save(a: Any, keys: tuple[str, ...], args: tuple[Any, ...]) -> dict[str, Any]:
    """Load the session, store ``args[0]`` in it, save. A session found gone is created anew
    under another key (Django's behaviour), recorded as such."""
    if not keys:
        return create(a, keys, args)
    store = _store(keys[0])
    seen = store.load().get("v")  # what the request saw (None: the session is gone)
    if store.session_key is None:
        return {"seen": None, "key": None}  # gone: a request would start a new session
    from django.contrib.sessions.backends.base import UpdateError

    store["v"] = args[0]
    try:
        store.save()
    except UpdateError:  # flushed between the load and the save: nothing written
        return {"seen": seen, "key": None}
    return {"seen": seen, "key": store.session_key}


def load(a: Any, keys: tuple[str, ...], args: tuple[Any, ...]) -> Any:
    if not keys:
        return None
    return _store(keys[0]).load().get("v")


def flush(a: Any, keys: tuple[str, ...], args: tuple[Any, ...]) -> bool:
    if not keys:
        return False
    _store(keys[0]).flush()  # clears without loading, deletes the key
    return True


def _create_effects(op: Op) -> list[Any]:
    if op.kind == OK:
        return [Write(op.value["key"], op.args[0], True)]
    return []  # raised: its key is unknown to everyone, no later op can name it


def _save_effects(op: Op) -> list[Any]:
    if not op.keys:
        return _create_effects(op)
    key, value = op.keys[0], op.args[0]
    if op.kind == INFO:
        return [Write(key, value, False)]
    if op.kind != OK:
        return []
    out: list[Any] = [Read(key, op.value["seen"])]
    if op.value["key"] == key:
        out.append(Write(key, value, True))
    return out


def _load_effects(op: Op) -> list[Any]:
    return [Read(op.keys[0], op.value)] if op.kind == OK and op.keys else []


def _flush_effects(op: Op) -> list[Any]:
    if not op.keys or op.kind not in (OK, INFO):
        return []
    return [Delete(op.keys[0], op.kind == OK)]


SESSION_OPS: dict[str, OpSpec] = {
    "session_create": OpSpec(_new, create, _create_effects, weight=0),
    "session_save": OpSpec(_existing, save, _save_effects, weight=0),
    "session_load": OpSpec(_existing_key, load, _load_effects, weight=0),
    "session_flush": OpSpec(_existing_key, flush, _flush_effects, weight=0),
}
SESSION_OPS = shaped(
    SESSION_OPS,
    {"session_create": (0, 1), "session_save": (0, 1), "session_load": (0, 0),
     "session_flush": (0, 0)},
)  # fmt: skip
OPS.update(SESSION_OPS)
