"""The settings ``python -m sentinel_cache.testing up`` (and ``demo``) print for a topology, in
the form the docs use: a Django ``CACHES`` dict, a Flask ``app.config.update(...)`` call and a
``SENTINEL_CACHE_URL`` line, each working as pasted (passwords included: the user chose them)."""

from __future__ import annotations

import json
import shlex
from typing import Any

from sentinel_cache.testing.cluster import LocalSentinelCluster


def django_options(cluster: LocalSentinelCluster) -> tuple[list[str], dict[str, Any]]:
    """``LOCATION`` and ``OPTIONS`` of a Django ``CACHES`` entry (and the core parser's input)."""
    config = cluster.config()
    options: dict[str, Any] = {"MASTERS": config["masters"]}
    if config["password"] is not None:
        options["PASSWORD"] = config["password"]
    if config["sentinel_password"] is not None:
        options["SENTINEL_PASSWORD"] = config["sentinel_password"]
    return list(config["sentinels"]), options


def settings_text(cluster: LocalSentinelCluster) -> str:
    """The copy-paste block for Django, Flask and the environment."""
    config = cluster.config()
    location, options = django_options(cluster)
    # json.dumps renders str and list[str] as valid Python literals with double quotes.
    flask = {
        "CACHE_TYPE": "sentinel_cache.flask.ShardedSentinelCache",
        "CACHE_REDIS_SENTINELS": config["sentinels"],
        "CACHE_REDIS_SENTINEL_MASTERS": config["masters"],
    }
    if config["password"] is not None:
        flask["CACHE_REDIS_PASSWORD"] = config["password"]
    if config["sentinel_password"] is not None:
        flask["CACHE_REDIS_SENTINEL_PASSWORD"] = config["sentinel_password"]
    lines = [
        f"# {cluster!r}",
        "",
        "# Django settings.py",
        "CACHES = {",
        '    "default": {',
        '        "BACKEND": "sentinel_cache.django.ShardedSentinelCache",',
        f'        "LOCATION": {json.dumps(location)},',
        f'        "OPTIONS": {json.dumps(options)},',
        "    }",
        "}",
        "",
        "# Flask config",
        "app.config.update(",
        *(f"    {name}={json.dumps(value)}," for name, value in flask.items()),
        ")",
        "",
        "# Environment",
        f"SENTINEL_CACHE_URL={shlex.quote(cluster.url())}",
    ]
    return "\n".join(lines)


def settings_json(cluster: LocalSentinelCluster, state: str | None = None) -> str:
    """:meth:`LocalSentinelCluster.config` plus the URL, server, pids and state file, as one
    JSON line."""
    payload = dict(cluster.config())
    payload.update(
        url=cluster.url(),
        server_kind=cluster.server_kind,
        server_version=cluster.server_version,
        pids=cluster.pids,
        state=state,
    )
    return json.dumps(payload)
