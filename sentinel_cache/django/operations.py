"""How the Django backend declares an operation: once, giving the sync method and its
``a``-prefixed async twin (as Django's own cache API pairs them)."""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

NOT_DONE: Any = object()


class Call(NamedTuple):
    """What a multi-key Django method does, made of keys and timeouts: the client operation to
    run, its arguments, how to turn its result into Django's (None: as it is), or the answer at
    once (``done``, e.g. ``get_many([])``). A single-key method gives just the arguments."""

    method: str
    args: tuple[Any, ...]
    finish: Callable[[Any], Any] | None = None
    kwargs: Mapping[str, Any] = {}
    done: Any = NOT_DONE


def operation(
    prepare: Callable[..., Call | tuple[Any, ...]],
    method: str | None = None,
    finish: Callable[[Any], Any] | None = None,
) -> tuple[Callable[..., Any], Callable[..., Any]]:
    """One declaration gives the sync method and its ``a``-prefixed async twin, on the clients
    of the same flavour. ``prepare`` makes keys and timeouts into the client method's arguments
    (the method is ``method``, by default named as the operation, and ``finish`` turns its
    result into Django's), or into a :class:`Call` when the call needs more than that. The
    arguments-only form keeps a near-cache hit to a few microseconds."""
    name = prepare.__name__.lstrip("_")
    target = method or name

    @functools.wraps(prepare)
    def sync(self: Any, *args: Any, **kwargs: Any) -> Any:
        call = prepare(self, *args, **kwargs)
        if isinstance(call, Call) and call.done is not NOT_DONE:
            return call.done  # e.g. get_many([]): answered without the client
        client = self._client  # the ``client`` property, inline (every sync call's path)
        if client is None or client.core.closed:
            client = self.client
        if isinstance(call, Call):
            result = getattr(client, call.method)(*call.args, **call.kwargs)
            return result if call.finish is None else call.finish(result)
        result = getattr(client, target)(*call)
        return result if finish is None else finish(result)

    @functools.wraps(prepare)
    async def asynchronous(self: Any, *args: Any, **kwargs: Any) -> Any:
        call = prepare(self, *args, **kwargs)
        if isinstance(call, Call):
            if call.done is not NOT_DONE:
                return call.done
            result = await getattr(self.aclient, call.method)(*call.args, **call.kwargs)
            return result if call.finish is None else call.finish(result)
        result = await getattr(self.aclient, target)(*call)
        return result if finish is None else finish(result)

    sync.__name__, asynchronous.__name__ = name, f"a{name}"
    sync.__qualname__ = f"ShardedSentinelCache.{name}"
    asynchronous.__qualname__ = f"ShardedSentinelCache.a{name}"
    return sync, asynchronous
