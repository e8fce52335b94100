"""Where the example apps find their sentinels: environment variables, as a deployment would.

* ``SENTINEL_CACHE_URL``: ``sentinel://[user:pass@]h1:26379,h2:26379/shard_a,shard_b?db=0``; or
* ``SENTINEL_CACHE_SENTINELS`` (``"h1:26379,h2:26379"``) and ``SENTINEL_CACHE_MASTERS``
  (``"shard_a,shard_b"``, ordered: the order decides where keys live).

``SENTINEL_CACHE_PASSWORD`` and ``SENTINEL_CACHE_SENTINEL_PASSWORD`` are optional.
``SENTINEL_CACHE_PREVIOUS_MASTERS`` (``"shard_a,shard_b"``) is set only while a resharding is
under way: the masters before the change, beside the new ``MASTERS`` (see docs/resharding.md).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

URL = "SENTINEL_CACHE_URL"
SENTINELS = "SENTINEL_CACHE_SENTINELS"
MASTERS = "SENTINEL_CACHE_MASTERS"
PASSWORD = "SENTINEL_CACHE_PASSWORD"
SENTINEL_PASSWORD = "SENTINEL_CACHE_SENTINEL_PASSWORD"
PREVIOUS_MASTERS = "SENTINEL_CACHE_PREVIOUS_MASTERS"

HELP = (
    f"set {URL}=sentinel://h1:26379,h2:26379/shard_a,shard_b, or {SENTINELS}=h1:26379,h2:26379 "
    f"and {MASTERS}=shard_a,shard_b (python -m sentinel_cache.testing up prints them)"
)


class TopologyNotConfigured(RuntimeError):
    """Neither the URL nor the sentinel list and master names are in the environment."""


def from_env(environ: Mapping[str, str] | None = None) -> tuple[Any, dict[str, Any]]:
    """``(LOCATION, OPTIONS)`` for the cache, from the environment.

    LOCATION is the URL or the list of sentinel addresses; OPTIONS always has what the URL or
    the separate variables do not carry (``PREVIOUS_MASTERS`` during a resharding).
    """
    env = os.environ if environ is None else environ
    options: dict[str, Any] = {}
    if env.get(PASSWORD):
        options["PASSWORD"] = env[PASSWORD]
    if env.get(SENTINEL_PASSWORD):
        options["SENTINEL_PASSWORD"] = env[SENTINEL_PASSWORD]
    previous = _names(env.get(PREVIOUS_MASTERS, ""))
    if previous:
        options["PREVIOUS_MASTERS"] = previous
    url = env.get(URL, "").strip()
    if url:
        return url, options
    sentinels = _names(env.get(SENTINELS, ""))
    masters = _names(env.get(MASTERS, ""))
    if not sentinels or not masters:
        raise TopologyNotConfigured(f"no sentinel topology configured: {HELP}")
    options["MASTERS"] = masters
    return sentinels, options


def _names(text: str) -> list[str]:
    return [name.strip() for name in text.split(",") if name.strip()]


def export(
    sentinels: list[str],
    masters: list[str],
    environ: Any = None,
    *,
    previous_masters: list[str] | None = None,
) -> None:
    """Put a topology in the environment (what the demo and ``make run`` do before setup, and
    what the demo's "deployments" change during its resharding)."""
    env = os.environ if environ is None else environ
    env.pop(URL, None)
    env[SENTINELS] = ",".join(sentinels)
    env[MASTERS] = ",".join(masters)
    if previous_masters:
        env[PREVIOUS_MASTERS] = ",".join(previous_masters)
    else:
        env.pop(PREVIOUS_MASTERS, None)
