"""Django's page cache with one computation per missing page: :func:`cache_page`,
:class:`CacheMiddleware` and the split pair :class:`UpdateCacheMiddleware` (first in
``MIDDLEWARE``) / :class:`FetchFromCacheMiddleware` (last), drop-in for Django's of the same
names (same arguments, same keys, same rules for what is cached), sync and async views.

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

The split pair coordinates the same way across the middleware between them: the fetch takes
the page's ticket and leaves it on the request, and the update ends it once it has stored the
response (so the waiters find it). Without our update outside it, the fetch ends its ticket
itself when the response comes back (Django's own update then stores after the waiters
looked: they run the view themselves, as without protection).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Awaitable, Callable
from functools import wraps
from typing import Any

from asgiref.sync import async_to_sync, iscoroutinefunction, sync_to_async
from django.http import HttpRequest
from django.middleware.cache import CacheMiddleware as DjangoCacheMiddleware
from django.middleware.cache import FetchFromCacheMiddleware as DjangoFetchFromCacheMiddleware
from django.middleware.cache import UpdateCacheMiddleware as DjangoUpdateCacheMiddleware
from django.utils.cache import get_cache_key, get_max_age
from django.utils.encoding import iri_to_uri
from django.utils.http import parse_http_date_safe

from sentinel_cache.core.ops.aio import AsyncSingleFlight, AsyncTicket
from sentinel_cache.core.ops.client import SingleFlight, Ticket
from sentinel_cache.core.ops.plans import MISS
from sentinel_cache.django.cache import ShardedSentinelCache

__all__ = ["CacheMiddleware", "FetchFromCacheMiddleware", "UpdateCacheMiddleware", "cache_page"]

Respond = Callable[[HttpRequest], Any]
Flight = tuple[ShardedSentinelCache, str]  # the cache, and the stored key a computation is for
#: Request attributes of the split pair: the fetch's ticket, for the update to end; and that
#: our update is outside the fetch (so the fetch leaves its ticket to it).
TICKET, UPDATING = "_sentinel_cache_ticket", "_sentinel_cache_updating"


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


def look(middleware: Any, request: HttpRequest) -> tuple[Any, Flight | None, Ticket | None]:
    """What a page cache middleware (``middleware``) finds for ``request``: the stored page;
    or the cache and the key to coordinate its computation on (None: Django's way: not a GET
    or HEAD, or no protection): the page's own key when the headers it varies on are known,
    so requests that get different pages do not wait for each other, else the URL's; or,
    with early refresh, a ticket to recompute a page that is about to expire (the other
    requests are served the stored one meanwhile)."""
    cache = middleware.cache
    if not (isinstance(cache, ShardedSentinelCache) and cache.cache_options.stampede_protection):
        return middleware.process_request(request), None, None
    options = cache.cache_options
    if options.stampede_early_refresh and request.method in ("GET", "HEAD"):
        key = get_cache_key(request, middleware.key_prefix, "GET", cache=cache)
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
    response = middleware.process_request(request)
    if response is not None or not request._cache_update_cache:  # type: ignore[attr-defined]
        return response, None, None
    key = get_cache_key(request, middleware.key_prefix, "GET", cache=cache)
    if key is None:
        uri = iri_to_uri(request.build_absolute_uri()).encode("ascii")
        url = hashlib.md5(uri, usedforsecurity=False).hexdigest()
        key = f"sentinel_cache.cache_page.{middleware.key_prefix}.{url}"
    return None, (cache, cache.make_and_validate_key(key)), None


def stored_key(middleware: Any, request: HttpRequest, cache: Any) -> str | None:
    """The key the page was just stored under, for early refresh to record its duration."""
    if not cache.cache_options.stampede_early_refresh:
        return None
    try:
        key = get_cache_key(request, middleware.key_prefix, "GET", cache=cache)
    except Exception:  # the shard fails: the ticket's end (next) reports it, and must run
        return None
    return None if key is None else cache.make_and_validate_key(key)


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
        return look(self, request)

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
                ticket.end(stored_key(self, request, cache))

    async def aserve(self, request: HttpRequest, respond: Callable[..., Awaitable[Any]]) -> Any:
        """:meth:`serve` for an async view; the cache's sync calls run as Django's async
        middleware runs them (``sync_to_async``), the waiting is the event loop's."""
        response, flight_of, refresh = await sync_to_async(look, thread_sensitive=True)(
            self, request
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
            again = sync_to_async(self.process_request, thread_sensitive=True)
            response = await again(request)
            if response is not None:
                return response
        try:
            return await store(request, await respond(request))
        finally:
            if ticket is not None:
                stored = await sync_to_async(stored_key, thread_sensitive=True)(
                    self, request, cache
                )
                await ticket.end(stored)


class FetchFromCacheMiddleware(DjangoFetchFromCacheMiddleware):
    """``django.middleware.cache.FetchFromCacheMiddleware`` (last in ``MIDDLEWARE``): a missing
    page's ticket taken by one request, the others served what it stores (see the module)."""

    def __init__(self, get_response: Any) -> None:
        super().__init__(get_response)
        self.asynchronous = iscoroutinefunction(get_response)

    def __call__(self, request: HttpRequest) -> Any:
        if self.asynchronous:
            return self.__acall__(request)
        response, ticket = self.fetch(request)
        if response is not None:
            return response
        if ticket is None or getattr(request, UPDATING, False):
            setattr(request, TICKET, ticket)
            return self.get_response(request)
        try:
            return self.get_response(request)
        finally:
            ticket.end()

    async def __acall__(self, request: HttpRequest) -> Any:
        response, ticket = await self.afetch(request)
        if response is not None:
            return response
        if ticket is None or getattr(request, UPDATING, False):
            setattr(request, TICKET, ticket)
            return await self.get_response(request)  # type: ignore[misc]
        try:
            return await self.get_response(request)  # type: ignore[misc]
        finally:
            await end_ticket(ticket, None)

    def fetch(self, request: HttpRequest) -> tuple[Any, Ticket | None]:
        """The stored page, or None and this request's ticket to compute it (None: no
        coordination, or another request's computation stored nothing)."""
        response, flight_of, refresh = look(self, request)
        if response is not None or flight_of is None:
            return response, refresh
        cache, key = flight_of
        ticket = SingleFlight(cache.client, cache.cache_options.stampede_lock_timeout).begin(key)
        return (self.process_request(request), None) if ticket is None else (None, ticket)

    async def afetch(self, request: HttpRequest) -> tuple[Any, Ticket | AsyncTicket | None]:
        """:meth:`fetch`, waiting on the event loop."""
        response, flight_of, refresh = await sync_to_async(look, thread_sensitive=True)(
            self, request
        )
        if response is not None or flight_of is None:
            return response, refresh
        cache, key = flight_of
        flight = AsyncSingleFlight(cache.aclient, cache.cache_options.stampede_lock_timeout)
        ticket = await flight.begin(key)
        if ticket is None:
            return await sync_to_async(self.process_request, thread_sensitive=True)(request), None
        return None, ticket


class UpdateCacheMiddleware(DjangoUpdateCacheMiddleware):
    """``django.middleware.cache.UpdateCacheMiddleware`` (first in ``MIDDLEWARE``): stores the
    page, then ends the ticket our :class:`FetchFromCacheMiddleware` took for it."""

    def __init__(self, get_response: Any) -> None:
        super().__init__(get_response)
        self.asynchronous = iscoroutinefunction(get_response)

    def __call__(self, request: HttpRequest) -> Any:
        if self.asynchronous:
            return self.__acall__(request)
        setattr(request, UPDATING, True)
        response: Any = self.get_response(request)
        ticket = getattr(request, TICKET, None)
        try:
            return self.process_response(request, response)
        finally:
            if ticket is not None:
                stored = stored_key(self, request, self.cache)
                if isinstance(ticket, AsyncTicket):  # an async fetch inside a sync update
                    async_to_sync(ticket.end)(stored)
                else:
                    ticket.end(stored)

    async def __acall__(self, request: HttpRequest) -> Any:
        setattr(request, UPDATING, True)
        response = await self.get_response(request)  # type: ignore[misc]
        ticket = getattr(request, TICKET, None)
        try:
            return await sync_to_async(self.process_response, thread_sensitive=True)(
                request, response
            )
        finally:
            if ticket is not None:
                stored = await sync_to_async(stored_key, thread_sensitive=True)(
                    self, request, self.cache
                )
                await end_ticket(ticket, stored)


async def end_ticket(ticket: Ticket | AsyncTicket, stored: Any) -> None:
    """End a ticket of either flavour from the event loop."""
    if isinstance(ticket, AsyncTicket):
        await ticket.end(stored)
    else:
        await sync_to_async(ticket.end, thread_sensitive=True)(stored)


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
