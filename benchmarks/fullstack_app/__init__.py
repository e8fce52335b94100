"""The tiny Django app of the full-stack benchmark (``benchmarks.fullstack``): one view doing a
realistic mix of 6 cache operations per request, async for ASGI (uvicorn) and sync for WSGI
(gunicorn), its cache chosen per contender by the environment (:mod:`.caches`)."""
