"""``flask sentinel-reshard``, where older imports name it; the commands live in
:mod:`sentinel_cache.flask.commands`."""

from __future__ import annotations

from sentinel_cache.flask.commands import RESHARD_COMMAND_NAME as COMMAND_NAME
from sentinel_cache.flask.commands import sentinel_reshard_command

__all__ = ["COMMAND_NAME", "sentinel_reshard_command"]
