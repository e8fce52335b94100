"""Django's page cache with one computation per missing page: :func:`cache_page` and
:class:`CacheMiddleware`, drop-in for ``django.views.decorators.cache.cache_page`` and
``django.middleware.cache.CacheMiddleware`` (same arguments, same keys, same rules for what is
cached), sync and async views.

Django's middleware gets the page, and on a miss runs the view and stores the response if it
may (200, not private, ...), with no coordination: every request that misses a cold or expired
page runs the view. Here, when the cache is ours with ``STAMPEDE_PROTECTION``, one request per
page across every process runs the view (:mod:`sentinel_cache.core.ops._async.single_flight`, under a lock on
the page key's shard); the others wait until it has stored the page, then are served it. A
response that is not stored (not cacheable, an error) lets each waiting request run the view
itself (they wait once, never twice). With the option off, or another cache backend, it is
Django's behaviour exactly.

A ``TemplateResponse`` is rendered before it is stored, inside the decorator (Django defers
that until after the view's caller has had it): the waiting requests must find it stored.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Awaitable, Callable
from functools import wraps
from typing import Any

from asgiref.sync import iscoroutinefunction, sync_to_async
from django.http import HttpRequest
from django.middleware.cache import CacheMiddleware as DjangoCacheMiddleware
from django.utils.cache import get_cache_key, get_max_age
from django.utils.encoding import iri_to_uri
from django.utils.http import parse_http_date_safe

from sentinel_cache.core.ops.aio import AsyncSingleFlight
from sentinel_cache.core.ops.client import SingleFlight, Ticket
from sentinel_cache.core.ops.plans import MISS
from sentinel_cache.django.cache import ShardedSentinelCache

__all__ = ["CacheMiddleware", "cache_page"]

Respond = Callable[[HttpRequest], Any]
Flight = tuple[ShardedSentinelCache, str]  # the cache, and the stored key a computation is for


def _aged(response: Any) -> Any:
    """A page served from the cache, with the ``Age`` header Django's
    ``FetchFromCacheMiddleware`` gives it."""
    max_age = get_max_age(response)
    expires = parse_http_date_safe(response.get("Expires", ""))
    if max_age is not None and expires is not None:
        response["Age"] = max(0, max_age - (expires - int(time.time())))
    return response


def _rendered(response: Any) -> Any:
    render = getattr(response, "render", None)
    return render() if callable(render) else response


class CacheMiddleware(DjangoCacheMiddleware):
    """``django.middleware.cache.CacheMiddleware``, one view run per missing page (see the
    module)."""

    def __init__(self, get_response: Any, *args: Any, **kwargs: Any) -> None:
        super().__init__(get_response, *args, **kwargs)
        # Django 5.1's MiddlewareMixin sets ``async_mode``; 4.2's marks the instance instead.
        self.asynchronous = iscoroutinefunction(get_response)

    def __call__(self, request: HttpRequest) -> Any:
        if self.asynchronous:
            return self.__acall__(request)
        return self.serve(request, self.get_response)

    async def __acall__(self, request: HttpRequest) -> Any:
        return await self.aserve(request, self.get_response)  # type: ignore[arg-type]

    def _look(self, request: HttpRequest) -> tuple[Any, Flight | None, Ticket | None]:
        """The stored page; or the cache and the key to coordinate its computation on (None:
        Django's way: not a GET or HEAD, or no protection): the page's own key when the
        headers it varies on are known, so requests that get different pages do not wait for
        each other, else the URL's; or, with early refresh, a ticket to recompute a page that
        is about to expire (the other requests are served the stored one meanwhile)."""
        cache = self.cache
        if not (
            isinstance(cache, ShardedSentinelCache) and cache.cache_options.stampede_protection
        ):
            return self.process_request(request), None, None
        options = cache.cache_options
        if options.stampede_early_refresh and request.method in ("GET", "HEAD"):
            key = get_cache_key(request, self.key_prefix, "GET", cache=cache)
            if key is not None:
                flight = SingleFlight(cache.client, options.stampede_lock_timeout)
                found, ticket = flight.read(
                    cache.make_and_validate_key(key), options.stampede_early_refresh
                )
                if ticket is not None:
                    request._cache_update_cache = True  # type: ignore[attr-defined]
                    return None, None, ticket
                if found is not MISS and found is not None:
                    request._cache_update_cache = False  # type: ignore[attr-defined]
                    return _aged(found), None, None
        response = self.process_request(request)
        if response is not None or not request._cache_update_cache:  # type: ignore[attr-defined]
            return response, None, None
        key = get_cache_key(request, self.key_prefix, "GET", cache=cache)
        if key is None:
            uri = iri_to_uri(request.build_absolute_uri()).encode("ascii")
            url = hashlib.md5(uri, usedforsecurity=False).hexdigest()
            key = f"sentinel_cache.cache_page.{self.key_prefix}.{url}"
        return None, (cache, cache.make_and_validate_key(key)), None

    def _stored(self, request: HttpRequest, cache: ShardedSentinelCache) -> str | None:
        """The key the page was just stored under, for early refresh to record its duration."""
        if not cache.cache_options.stampede_early_refresh:
            return None
        try:
            key = get_cache_key(request, self.key_prefix, "GET", cache=cache)
        except Exception:  # the shard fails: the ticket's end (next) reports it, and must run
            return None
        return None if key is None else cache.make_and_validate_key(key)

    def _store(self, request: HttpRequest, response: Any) -> Any:
        return self.process_response(request, _rendered(response))

    def serve(self, request: HttpRequest, respond: Respond) -> Any:
        """The page from the cache, or ``respond(request)`` stored (by one request at a time)."""
        response, flight_of, refresh = self._look(request)
        if refresh is not None:  # about to expire: this request recomputes it
            try:
                return self._store(request, respond(request))
            finally:
                refresh.end()
        if response is not None:
            return response
        if flight_of is None:
            return self._store(request, respond(request))
        cache, key = flight_of
        flight = SingleFlight(cache.client, cache.cache_options.stampede_lock_timeout)
        ticket = flight.begin(key)
        if ticket is None:  # another request computed it: served from the cache if stored
            response = self.process_request(request)
            if response is not None:
                return response
        try:
            return self._store(request, respond(request))
        finally:
            if ticket is not None:
                ticket.end(self._stored(request, cache))

    async def aserve(self, request: HttpRequest, respond: Callable[..., Awaitable[Any]]) -> Any:
        """:meth:`serve` for an async view; the cache's sync calls run as Django's async
        middleware runs them (``sync_to_async``), the waiting is the event loop's."""
        response, flight_of, refresh = await sync_to_async(self._look, thread_sensitive=True)(
            request
        )
        store = sync_to_async(self._store, thread_sensitive=True)
        if refresh is not None:
            try:
                return await store(request, await respond(request))
            finally:
                await sync_to_async(refresh.end, thread_sensitive=True)()
        if response is not None:
            return response
        if flight_of is None:
            return await store(request, await respond(request))
        cache, key = flight_of
        flight = AsyncSingleFlight(cache.aclient, cache.cache_options.stampede_lock_timeout)
        ticket = await flight.begin(key)
        if ticket is None:
            look = sync_to_async(self.process_request, thread_sensitive=True)
            response = await look(request)
            if response is not None:
                return response
        try:
            return await store(request, await respond(request))
        finally:
            if ticket is not None:
                stored = await sync_to_async(self._stored, thread_sensitive=True)(request, cache)
                await ticket.end(stored)


def cache_page(
    timeout: float | None, *, cache: str | None = None, key_prefix: str | None = None
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """``django.views.decorators.cache.cache_page``: the view's response cached for
    ``timeout`` seconds in ``caches[cache]``; a missing page computed by one request at a time
    across processes (see the module)."""

    def decorator(view: Callable[..., Any]) -> Callable[..., Any]:
        middleware = CacheMiddleware(
            view, page_timeout=timeout, cache_alias=cache, key_prefix=key_prefix
        )
        if iscoroutinefunction(view):

            async def async_view(request: HttpRequest, *args: Any, **kwargs: Any) -> Any:
                return await middleware.aserve(request, lambda r: view(r, *args, **kwargs))

            return wraps(view)(async_view)

        def sync_view(request: HttpRequest, *args: Any, **kwargs: Any) -> Any:
            return middleware.serve(request, lambda r: view(r, *args, **kwargs))

        return wraps(view)(sync_view)

    return decorator
