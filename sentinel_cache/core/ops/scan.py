"""One shard's ``SCAN``: the one definition every operation over a shard's keys goes through
(``iter_keys``, ``delete_pattern``, ``clear`` with a prefix, the resharding plan and migration),
and over a set's members (``SSCAN``: ``sscan_iter``), whose cursor is one server's as well.

A ``SCAN`` cursor belongs to one server's hash table (seeded at random per process): sent to
another server it means nothing, and the scan silently skips and repeats keys. So a scan notes
the shard's master generation (:meth:`~sentinel_cache.core.topology.shard.Shard.current`) before its
first ``SCAN``, and begins again from cursor 0 whenever the generation changed: seen before a
``SCAN`` is sent, or after its reply (the safety net may have re-resolved and sent it again on
the new master, with the old cursor). A scan is sent to the master only, never to a replica in
the read rotation, for the same reason.

The promise: every key matching the pattern and present on the shard throughout the scan is
returned at least once. A key may be returned more than once: ``SCAN`` itself may repeat keys,
and a restart returns again what the first pass had returned.

:class:`ShardScan` does no I/O (the sync and asyncio clients and the migration send its
commands their own way).
"""

from __future__ import annotations

from typing import Any

from sentinel_cache.core.ops.plans import Command, logger
from sentinel_cache.core.topology.shard import Shard
from sentinel_cache.exceptions import ShardUnavailableError

#: Restarts of one shard's scan (its master changed each time) before the scan gives up: a
#: master that keeps moving would otherwise keep the scan going for ever.
MAX_RESTARTS = 10


class ShardScan:
    """The state of one shard's scan: ``command()`` is the next ``SCAN`` to send, ``take(reply)``
    its keys; ``done`` once a pass reached cursor 0 on the master it began on."""

    __slots__ = (
        "shard",
        "key",
        "match",
        "count",
        "operation",
        "cursor",
        "generation",
        "begun",
        "done",
        "restarts",
    )

    def __init__(
        self, shard: Shard, match: str, count: int, *, operation: str, key: Any = None
    ) -> None:
        self.shard = shard
        self.key = key  # a set's key: its members are scanned (SSCAN), not the shard's keys
        self.match = match
        self.count = count
        self.operation = operation  # named in the log line of a restart
        self.cursor = 0
        self.generation = shard.generation  # that of the master the pass began on
        self.begun = False  # a reply of this pass was taken
        self.done = False
        self.restarts = 0

    def command(self) -> Command:
        """The next ``SCAN``: from cursor 0 again if the shard's master changed since the pass
        began. Raises :class:`~sentinel_cache.ShardUnavailableError` after
        :data:`MAX_RESTARTS` restarts."""
        generation = self.shard.generation
        if generation != self.generation:
            if self.begun:
                self._restart()
            self.cursor, self.generation, self.begun = 0, generation, False
        head: Command = ("SCAN",) if self.key is None else ("SSCAN", self.key)
        return (*head, self.cursor, "MATCH", self.match, "COUNT", self.count)

    def take(self, reply: Any) -> list[Any]:
        """The keys of a ``SCAN`` reply. A pass is done at cursor 0 if the shard's master is
        still the one it began on; a reply read after a change (from either master) leaves the
        scan to :meth:`command`, which starts it again (generations only grow)."""
        cursor, keys = reply
        self.cursor = int(cursor)
        self.begun = True
        self.done = self.cursor == 0 and self.shard.generation == self.generation
        return list(keys)

    def _restart(self) -> None:
        self.restarts += 1
        shard = self.shard
        if self.restarts > MAX_RESTARTS:
            raise ShardUnavailableError(
                f"shard {shard.label}: {self.operation} gave up: its master changed "
                f"{self.restarts} times during the scan"
            )
        logger.warning(
            "%s: shard %s has a new master (%s): scanning it again from the start",
            self.operation,
            shard.label,
            shard.address,
        )
