"""Cache operations over the sharded core, shared by the Django and Flask adapters.

Adapters make keys and timeouts and hand every call here (as Django's ``RedisCache`` hands them
to its client). Keys arrive final, exactly as stored, so placement matches Jedis. Multi-key calls
are grouped per shard and scattered: every shard's batch is sent before any reply is read, so
four shards cost about one round trip, not four.
"""

from __future__ import annotations

import functools
import hashlib
import logging
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import redis
from redis.exceptions import NoScriptError, ResponseError

from sentinel_cache.config import Address
from sentinel_cache.exceptions import PoolExhaustedError
from sentinel_cache.pools import MASTER_ERRORS, Shard, ShardedSentinelPool
from sentinel_cache.serializers import Codec, InvalidValueError

logger = logging.getLogger("sentinel_cache")

Command = tuple[Any, ...]
Plan = dict[Shard, list[Command]]
Groups = dict[Shard, list[Any]]
MISS: Any = object()  # a stored value that is absent or unreadable

# Atomic "increment only if present": INCRBY alone would create a missing key (without a TTL).
INCR_IF_EXISTS = """
if redis.call('EXISTS', KEYS[1]) == 1 then
    return redis.call('INCRBY', KEYS[1], ARGV[1])
end
return false
"""
# Sent as EVALSHA: the body goes over the wire (and through the server's SHA1) only when a
# server answers NOSCRIPT (first use, restart, failover to a fresh replica, SCRIPT FLUSH).
INCR_IF_EXISTS_SHA = hashlib.sha1(INCR_IF_EXISTS.encode()).hexdigest()


def is_ok(reply: Any) -> bool:
    return reply is True or reply == b"OK" or reply == "OK"


def expiry_args(timeout: float | None) -> tuple[Any, ...]:
    """``SET`` arguments for a timeout in seconds (None: no expiry)."""
    if timeout is None:
        return ()
    return ("PX", max(1, int(timeout * 1000)))


class ClientBase:
    """What the sync and async clients share: the core, the codec, the durability setting."""

    def __init__(
        self,
        pool: ShardedSentinelPool,
        codec: Codec,
        *,
        durable_replicas: int = 0,
        durable_timeout_ms: int = 100,
    ) -> None:
        self.pool = pool
        self.codec = codec
        self.durable_replicas = durable_replicas
        self.durable_timeout_ms = durable_timeout_ms

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.pool!r} codec={self.codec!r}>"

    def encode(self, value: Any) -> bytes | int:
        return self.codec.dumps(value)

    def decode(self, data: Any, key: Any = None) -> Any:
        """Stored bytes to a value; data that fails to decode or verify is ``MISS``, logged."""
        try:
            return self.codec.loads(data)
        except InvalidValueError as exc:
            logger.warning("unreadable value at key %s treated as a miss: %s", short_key(key), exc)
            return MISS

    # -- multi-key plans and their replies: the same for the sync and async clients ----------
    def mget_plan(self, keys: Iterable[Any]) -> tuple[Groups, Plan]:
        groups = self.pool.group_by_shard(dict.fromkeys(keys))
        return groups, {shard: [("MGET", *group)] for shard, group in groups.items()}

    def found(self, groups: Groups, replies: Mapping[Shard, list[Any]]) -> dict[Any, Any]:
        found: dict[Any, Any] = {}
        for shard, (values,) in replies.items():
            for key, data in zip(groups[shard], values, strict=True):
                value = MISS if data is None else self.decode(data, key)
                if value is not MISS:
                    found[key] = value
        return found

    def set_plan(self, mapping: Mapping[Any, Any], timeout: float | None) -> tuple[Groups, Plan]:
        groups = self.pool.group_by_shard(mapping)
        expiry = expiry_args(timeout)
        plan: Plan = {}
        for shard, group in groups.items():
            commands: list[Command] = [
                ("SET", key, self.encode(mapping[key]), *expiry) for key in group
            ]
            if self.durable_replicas:
                commands.append(("WAIT", self.durable_replicas, self.durable_timeout_ms))
            plan[shard] = commands
        return groups, plan

    @staticmethod
    def not_set(groups: Groups, replies: Mapping[Shard, list[Any]]) -> list[Any]:
        """The keys whose SET was not acknowledged (a trailing WAIT reply is ignored)."""
        return [
            key
            for shard, shard_replies in replies.items()
            for key, reply in zip(groups[shard], shard_replies, strict=False)
            if not is_ok(reply)
        ]

    def del_plan(self, keys: Iterable[Any]) -> Plan:
        groups = self.pool.group_by_shard(dict.fromkeys(keys))
        return {shard: [("DEL", *group)] for shard, group in groups.items()}


class CacheClient(ClientBase):
    """Framework-free cache operations; ``timeout`` is seconds, None means never expire, and
    zero or less means the value expires at once (as in Django)."""

    # -- single key --------------------------------------------------------------------------
    def _run(
        self,
        key: Any,
        operation: Callable[[redis.Redis], Any],
        *,
        write: bool,
        idempotent: bool = True,
    ) -> Any:
        shard = self.pool.shard_for(key)
        return self.pool.execute(shard, operation, write=write, idempotent=idempotent)

    def _durable(self, client: redis.Redis, *command: Any) -> Any:
        """Run one write; with ``durable_replicas`` also ``WAIT`` on the same connection."""
        if not self.durable_replicas:
            return client.execute_command(*command)
        pipe = client.pipeline(transaction=False)
        pipe.execute_command(*command)
        pipe.execute_command("WAIT", self.durable_replicas, self.durable_timeout_ms)
        reply, acked = pipe.execute()
        if acked < self.durable_replicas:
            logger.warning(
                "write to %r acknowledged by %d of %d replicas within %d ms",
                command[1] if len(command) > 1 else command,
                acked,
                self.durable_replicas,
                self.durable_timeout_ms,
            )
        return reply

    def get(self, key: Any, default: Any = None) -> Any:
        data = self._run(key, lambda c: c.execute_command("GET", key), write=False)
        value = MISS if data is None else self.decode(data, key)
        return default if value is MISS else value

    def set(self, key: Any, value: Any, timeout: float | None, *, nx: bool = False) -> bool:
        if timeout is not None and timeout <= 0:
            if nx:  # "added" and expired at once: it succeeds only where the key was absent
                return not self.has_key(key)
            self.delete(key)
            return True
        command: tuple[Any, ...] = ("SET", key, self.encode(value), *expiry_args(timeout))
        if nx:
            command += ("NX",)
        reply = self._run(key, lambda c: self._durable(c, *command), write=True, idempotent=not nx)
        return is_ok(reply)

    def add(self, key: Any, value: Any, timeout: float | None) -> bool:
        return self.set(key, value, timeout, nx=True)

    def touch(self, key: Any, timeout: float | None) -> bool:
        """True if the key exists (PERSIST alone answers 0 for a key that had no expiry)."""
        if timeout is None:
            commands = [("EXISTS", key), ("PERSIST", key)]
            exists, _ = self._run(key, functools.partial(_pipeline, commands=commands), write=True)
            return bool(exists)
        if timeout <= 0:
            return self.delete(key)
        ms = max(1, int(timeout * 1000))
        return bool(self._run(key, lambda c: c.execute_command("PEXPIRE", key, ms), write=True))

    def delete(self, key: Any) -> bool:
        return bool(self._run(key, lambda c: c.execute_command("DEL", key), write=True))

    def has_key(self, key: Any) -> bool:
        return bool(self._run(key, lambda c: c.execute_command("EXISTS", key), write=False))

    def incr(self, key: Any, delta: int = 1) -> int:
        """Atomic and TTL-preserving; ValueError if the key is missing (Django semantics)."""

        def run(client: redis.Redis) -> Any:
            try:
                return client.execute_command("EVALSHA", INCR_IF_EXISTS_SHA, 1, key, delta)
            except NoScriptError:  # nothing ran: safe to send the body, which caches it
                return client.execute_command("EVAL", INCR_IF_EXISTS, 1, key, delta)

        value = self._run(key, run, write=True, idempotent=False)
        if value is None:
            raise ValueError(f"Key {key!r} not found")
        return int(value)

    def ttl(self, key: Any) -> float | None:
        """Seconds left; None for no expiry; 0 for a missing key."""
        ms = self._run(key, lambda c: c.execute_command("PTTL", key), write=False)
        if ms == -1:
            return None
        return 0 if ms < 0 else ms / 1000

    def expire(self, key: Any, timeout: float) -> bool:
        return self.touch(key, timeout)

    def persist(self, key: Any) -> bool:
        return self.touch(key, None)

    def get_client(self, key: Any, *, write: bool = True) -> redis.Redis:
        return self.pool.client_for(key, write=write)

    def lock(self, key: Any, **kwargs: Any) -> Any:
        """A redis-py lock held on the key's shard (its current master)."""
        return self.pool.client_for(key, write=True).lock(key, **kwargs)

    # -- many keys ---------------------------------------------------------------------------
    def scatter(
        self, plan: Mapping[Shard, Sequence[Command]], *, write: bool
    ) -> dict[Shard, list[Any]]:
        """Send every shard's batch before reading any reply.

        A shard whose batch failed goes through the core's safety net once: re-resolve
        (without waiting on the node that failed), then one resend only if the shard moved, so
        a hung master costs one socket timeout, not a second one for the resend. An error
        reply (not a connection failure) takes the per-command path, which reports it.
        """
        pool = self.pool
        if len(plan) == 1:
            ((shard, commands),) = plan.items()
            return {shard: pool.execute(shard, functools.partial(_pipeline, commands=commands))}
        for shard in plan:
            pool.ready(shard, write)
        replies: dict[Shard, list[Any]] = {}
        failed: dict[Shard, tuple[BaseException, Address | None, int]] = {}
        resend: list[Shard] = []
        in_flight: list[tuple[Shard, Any, Sequence[Command], Address | None, int]] = []
        try:
            for shard, commands in plan.items():
                address, generation = shard.current()
                try:
                    connection = shard.pool.get_connection()
                except PoolExhaustedError:
                    raise
                except MASTER_ERRORS as exc:  # a refused connect
                    failed[shard] = (exc, address, generation)
                    continue
                in_flight.append((shard, connection, commands, address, generation))
                try:
                    connection.send_packed_command(connection.pack_commands(commands))
                except MASTER_ERRORS as exc:
                    connection.disconnect()
                    failed[shard] = (exc, address, generation)
            for shard, connection, commands, address, generation in in_flight:
                if shard in failed:
                    continue
                try:
                    replies[shard] = [connection.read_response() for _ in commands]
                except MASTER_ERRORS as exc:
                    connection.disconnect()
                    failed[shard] = (exc, address, generation)
                except ResponseError:
                    connection.disconnect()
                    resend.append(shard)
        finally:
            for shard, connection, *_ in in_flight:
                shard.pool.release(connection)
        for shard, (error, address, generation) in failed.items():
            if pool.should_reresolve(shard, error, generation):
                pool.reresolve(shard, reason=f"{type(error).__name__}: {error}", suspect=address)
            pool.retry_or_raise(shard, error, generation, idempotent=True)
            resend.append(shard)
        for shard in resend:
            replies[shard] = pool.execute(
                shard, functools.partial(_pipeline, commands=plan[shard]), write=write
            )
        return replies

    def get_many(self, keys: Iterable[Any]) -> dict[Any, Any]:
        groups, plan = self.mget_plan(keys)
        return self.found(groups, self.scatter(plan, write=False)) if plan else {}

    def set_many(self, mapping: Mapping[Any, Any], timeout: float | None) -> list[Any]:
        """Returns the keys that failed (Django's contract)."""
        if not mapping:
            return []
        if timeout is not None and timeout <= 0:
            self.delete_many(list(mapping))
            return []
        groups, plan = self.set_plan(mapping, timeout)
        return self.not_set(groups, self.scatter(plan, write=True))

    def delete_many(self, keys: Iterable[Any]) -> int:
        plan = self.del_plan(keys)
        if not plan:
            return 0
        return sum(int(r[0]) for r in self.scatter(plan, write=True).values())

    # -- whole cache -------------------------------------------------------------------------
    def iter_keys(self, pattern: str, *, count: int = 1000) -> Iterator[bytes]:
        """Every key matching ``pattern`` on every shard (``SCAN``, never ``KEYS``)."""
        for shard in self.pool.shards:
            client = self.pool.execute(shard, lambda c: c, write=False)
            yield from client.scan_iter(match=pattern, count=count)

    def delete_pattern(self, pattern: str, *, count: int = 1000) -> int:
        return sum(
            self.delete_pattern_on(shard, pattern, count=count) for shard in self.pool.shards
        )

    def delete_pattern_on(self, shard: Shard, pattern: str, *, count: int = 1000) -> int:
        """UNLINK the keys matching ``pattern`` on one shard, found with ``SCAN``."""
        return self.pool.execute(
            shard, functools.partial(unlink_matching, pattern=pattern, count=count), write=True
        )

    def clear_shard(self, shard: Shard, prefix: str | None) -> None:
        """One shard's part of :meth:`clear` (adapters that fail open clear shard by shard)."""
        if prefix:
            self.delete_pattern_on(shard, escape_pattern(prefix) + "*")
        else:
            self.pool.execute(shard, lambda c: c.execute_command("FLUSHDB", "ASYNC"), write=True)

    def clear(self, prefix: str | None) -> None:
        """With a prefix: SCAN + UNLINK of this cache's keys on every shard. Without one: the
        whole database of every shard is flushed, as Django's RedisCache does."""
        for shard in self.pool.shards:
            self.clear_shard(shard, prefix)


def short_key(key: Any, limit: int = 200) -> str:
    """A key for a log line: a 1 MB key must not make a 1 MB log line."""
    text = repr(key)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} chars)"


def escape_pattern(text: str) -> str:
    """Escape glob characters so a key prefix matches only itself in ``SCAN MATCH``."""
    return "".join("\\" + ch if ch in "*?[]\\" else ch for ch in text)


def _pipeline(client: redis.Redis, commands: Sequence[Command]) -> list[Any]:
    pipe = client.pipeline(transaction=False)
    for command in commands:
        pipe.execute_command(*command)
    return pipe.execute()


def unlink_matching(client: redis.Redis, pattern: str, count: int) -> int:
    deleted = 0
    batch: list[bytes] = []
    for key in client.scan_iter(match=pattern, count=count):
        batch.append(key)
        if len(batch) >= count:
            deleted += client.execute_command("UNLINK", *batch)
            batch.clear()
    if batch:
        deleted += client.execute_command("UNLINK", *batch)
    return deleted
