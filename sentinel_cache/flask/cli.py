"""``flask sentinel-status``, where plugin entry points and older imports name it
(``sentinel_cache.flask.cli:sentinel_status_command``); the commands live in
:mod:`sentinel_cache.flask.commands`."""

from __future__ import annotations

from sentinel_cache.flask.commands import (
    CACHE_TYPE,
    COMMAND_NAME,
    OperatorCommand,
    config_error,
    current_or_loaded_app,
    init_app,
    sentinel_backends,
    sentinel_status_command,
)

#: The old name of :class:`~sentinel_cache.flask.commands.OperatorCommand`.
StatusCommand = OperatorCommand

__all__ = [
    "CACHE_TYPE",
    "COMMAND_NAME",
    "StatusCommand",
    "config_error",
    "current_or_loaded_app",
    "init_app",
    "sentinel_backends",
    "sentinel_status_command",
]
