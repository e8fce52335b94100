"""The sync cache client: the operations generated from their asyncio source, plus the two
sync-only escape hatches (a raw redis-py client, a lock).

Adapters make keys and timeouts and hand every call here (as Django's ``RedisCache`` hands them
to its client). See :mod:`sentinel_cache.core.ops._async.client` for the operations, and
:mod:`sentinel_cache.core.ops.plans` for their commands and replies.
"""

from __future__ import annotations

import uuid
import weakref
from collections.abc import Callable
from typing import Any, Literal, TypeVar

import redis
import redis.lock
from redis.exceptions import LockNotOwnedError

from sentinel_cache.core.ops._sync.client import SCAN_COUNT
from sentinel_cache.core.ops._sync.hashes import HashOperations
from sentinel_cache.core.ops._sync.runner import send
from sentinel_cache.core.ops._sync.sets import SetOperations
from sentinel_cache.core.ops._sync.single_flight import SingleFlight, Ticket
from sentinel_cache.core.ops._sync.sorted_sets import SortedSetOperations
from sentinel_cache.core.ops._sync.stampede import StampedeOperations
from sentinel_cache.core.ops.plans import (
    INCR_IF_EXISTS,
    INCR_IF_EXISTS_SHA,
    MISS,
    ClientBase,
    Command,
    escape_pattern,
    expiry_args,
    is_ok,
    logger,
    short_key,
)
from sentinel_cache.core.serializers import Codec
from sentinel_cache.core.topology.shard import Shard
from sentinel_cache.core.topology.sharded_pool import ShardedSentinelPool

T = TypeVar("T")


class CacheClient(StampedeOperations, SortedSetOperations, SetOperations, HashOperations):
    """Framework-free cache operations; ``timeout`` is seconds, None means never expire, and
    zero or less means the value expires at once (as in Django)."""

    def get_client(self, key: Any, *, write: bool = True) -> redis.Redis:
        """A redis-py client on the key's shard (its master, or a replica for reads if set):
        raw commands on it bypass the safety net."""
        return self.core.client_for(key, write=write)

    def lock(self, key: Any, **kwargs: Any) -> Any:
        """A redis-py lock held on the key's shard, its token written in the cache's format,
        whose commands go through the safety net (:class:`CacheLock`). Keyword arguments are
        ``redis.Redis.lock``'s; another ``lock_class`` gets a raw client, as before."""
        lock_class = kwargs.pop("lock_class", None) or CacheLock
        if not (isinstance(lock_class, type) and issubclass(lock_class, CacheLock)):
            return self.core.client_for(key, write=True).lock(key, lock_class=lock_class, **kwargs)
        shard = self.core.shard_for(key)
        return lock_class(self, shard, key, **kwargs)


#: The lock's acquire, safe to send again: ``SET NX PX`` that also answers 1 when the lock
#: already holds this token (an earlier send of it whose reply was lost took it; its expiry is
#: restarted, so the holder never believes it has longer than it has). KEYS: the lock; ARGV:
#: the token, the ms to live (0: none). 1 if held by this token now, else 0 (held by another
#: token, or the key holds another type).
ACQUIRE_LOCK = """
local held = redis.pcall('GET', KEYS[1])
if held == ARGV[1] then
    if ARGV[2] ~= '0' then redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
    return 1
end
if held then return 0 end
if ARGV[2] == '0' then
    redis.call('SET', KEYS[1], ARGV[1])
else
    redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
end
return 1
"""


class CacheLock(redis.lock.Lock):
    """redis-py's lock, its commands sent through the cache's safety net, so a lock follows
    the rules and errors of every other operation: the shard's write fence, a re-resolve on a
    connection error, ``ShardUnavailableError`` naming the shard (never redis-py's bare
    ``ConnectionError`` naming an address), ``OUTAGE_HOLD`` for what may be sent again, and
    the ``WAIT`` of ``DURABLE_REPLICAS`` after its writes. Never fail-open
    (``IGNORE_EXCEPTIONS`` does not apply): a lock that silently did nothing would be worse
    than an error.

    What may be sent again (held by ``OUTAGE_HOLD``, resent after a lost reply): the acquire
    (:data:`ACQUIRE_LOCK`: a resend finds its own token and answers it holds the lock, where a
    bare ``SET NX`` would answer no and leave the lock held by nobody until it expires); the
    release (a compare-and-delete never deletes another holder's lock: see :meth:`do_release`);
    ``reacquire`` and ``extend(replace_ttl=True)`` (they set an expiry); the reads. Not
    ``extend`` that adds to the expiry: sent twice it would add twice, so its lost reply raises
    the shard's error, as ``incr``'s does.

    Its token is written in the cache's format: a key held by a lock is then present to every
    read alike (``get`` returns the token, ``has_key`` is True), where redis-py's bare token
    would be a value the codec cannot read, which the cache treats as absent."""

    def __init__(self, client: CacheClient, shard: Shard, name: Any, **kwargs: Any) -> None:
        self.client, self.shard = client, shard
        self.codec = client.codec
        super().__init__(shard.client, name, **kwargs)

    def __repr__(self) -> str:
        return (
            f"<{type(self).__name__} {short_key(self.name)} on shard {self.shard.label} "
            f"timeout={self.timeout} held={self.local.token is not None}>"
        )

    def register_scripts(self) -> None:
        """Nothing to register: the scripts are sent as ``EVAL`` through the safety net."""

    def acquire(
        self,
        sleep: float | None = None,
        blocking: bool | None = None,
        blocking_timeout: float | None = None,
        token: str | bytes | None = None,
    ) -> bool:
        if token is None:
            token = self.codec.dumps(uuid.uuid4().hex)  # type: ignore[assignment]
        return bool(super().acquire(sleep, blocking, blocking_timeout, token))  # type: ignore[arg-type]

    def _write(self, command: Command, *, idempotent: bool) -> Any:
        """One write of the lock through the safety net, and the WAIT of DURABLE_REPLICAS."""
        client = self.client
        wait = client.durable_wait
        commands = [command] if wait is None else [command, wait]
        replies = client.execute(self.shard, commands, write=True, idempotent=idempotent)
        if wait is not None:
            client.check_durable(self.shard, short_key(self.name), replies[1])
        return replies[0]

    def _read(self) -> Any:
        """The lock key's token, from the master only (a replica's copy may lag its holder's),
        held by ``OUTAGE_HOLD`` while the master is unreachable."""
        (token,) = self.client.execute(
            self.shard, [("GET", self.name)], write=False, replicas=False, outage=False
        )
        return token

    def do_acquire(self, token: str) -> bool:
        ms = max(1, int(self.timeout * 1000)) if self.timeout else 0
        return self._write(("EVAL", ACQUIRE_LOCK, 1, self.name, token, ms), idempotent=True) == 1

    def locked(self) -> bool:
        return self._read() is not None

    def owned(self) -> bool:
        token = self._read()
        return self.local.token is not None and token == self.local.token

    def do_release(self, expected_token: str) -> None:
        """The compare-and-delete, sent again when its reply was lost (it deletes only this
        token's lock). A resend that finds the lock no longer this token's cannot tell whether
        the first send deleted it or it had expired: that counts as released (the lock is not
        this token's, and nobody else's was touched), logged; so does one whose first try
        failed before it was sent (a refused connect: told apart from a lost reply by the
        runner's rules, not here). A release sent once that finds it so raises
        ``LockNotOwnedError`` as redis-py's."""
        client, sends = self.client, 0
        commands: list[Command] = [("EVAL", self.LUA_RELEASE_SCRIPT, 1, self.name, expected_token)]
        if client.durable_wait is not None:
            commands.append(client.durable_wait)

        def release(redis_client: Any) -> list[Any]:
            nonlocal sends
            sends += 1
            return send(redis_client, commands)

        replies = client.run(self.shard, release, write=True, idempotent=True)
        if client.durable_wait is not None:
            client.check_durable(self.shard, short_key(self.name), replies[1])
        if replies[0]:
            return
        if sends > 1:
            logger.warning(
                "lock %s on shard %s: released by a resend after its reply was lost; the lock "
                "was gone (the first send released it, or it had expired)",
                short_key(self.name),
                self.shard.label,
            )
            return
        raise LockNotOwnedError("Cannot release a lock that's no longer owned", lock_name=self.name)

    def do_extend(self, additional_time: float, replace_ttl: bool) -> Literal[True]:
        ms = int(additional_time * 1000)
        script = self.LUA_EXTEND_SCRIPT
        token, replace = self.local.token, "1" if replace_ttl else "0"
        command = ("EVAL", script, 1, self.name, token, ms, replace)
        if not self._write(command, idempotent=replace_ttl):
            raise LockNotOwnedError(
                "Cannot extend a lock that's no longer owned", lock_name=self.name
            )
        return True

    def do_reacquire(self) -> Literal[True]:
        ms = int(self.timeout * 1000) if self.timeout else 0
        command = ("EVAL", self.LUA_REACQUIRE_SCRIPT, 1, self.name, self.local.token, ms)
        if not self._write(command, idempotent=True):
            raise LockNotOwnedError(
                "Cannot reacquire a lock that's no longer owned", lock_name=self.name
            )
        return True


_raw: weakref.WeakKeyDictionary[ShardedSentinelPool, CacheClient] = weakref.WeakKeyDictionary()


def execute(
    pool: ShardedSentinelPool,
    shard: Shard,
    operation: Callable[[redis.Redis], T],
    *,
    write: bool = True,
    idempotent: bool = True,
) -> T:
    """Run ``operation(client)`` on the shard (a ``redis.Redis`` on its master, or for a read on
    a replica in rotation) with the cache operations' safety net, the one definition of it
    (:meth:`CacheClient.run`): re-resolve on a connection error, timeout or READONLY, one retry
    of an idempotent operation if the master moved, :class:`~sentinel_cache.StaleReplyError`
    for a non-idempotent one whose reply came from a replaced master, and the write fence."""
    client = _raw.get(pool)
    if client is None:
        client = _raw[pool] = CacheClient(pool, Codec())
    return client.run(shard, operation, write=write, idempotent=idempotent)


__all__ = [
    "INCR_IF_EXISTS",
    "INCR_IF_EXISTS_SHA",
    "MISS",
    "SCAN_COUNT",
    "CacheClient",
    "CacheLock",
    "SingleFlight",
    "Ticket",
    "ClientBase",
    "escape_pattern",
    "execute",
    "expiry_args",
    "is_ok",
    "short_key",
]
