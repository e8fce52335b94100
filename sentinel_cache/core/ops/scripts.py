"""The Lua scripts the operations and the resharding send, and the constants they share.

Kept apart from the plans (:mod:`sentinel_cache.core.ops.plans`) because the scripts are one
protocol: the tombstones a delete leaves, the guard every copy onto an owner passes, and the
deadlines that bound a copy (read the comments in order). The operator tools' migration sends
the same scripts.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from typing import Any

# Atomic "increment only if present": INCRBY alone would create a missing key (without a TTL).
# The new value is returned as the server stores it (GET): a Lua number is a double, exact only
# up to 2**53, so returning INCRBY's reply would round a large counter (2**63 - 1 came back as
# -2**63).
INCR_IF_EXISTS = """
if redis.call('EXISTS', KEYS[1]) == 1 then
    redis.call('INCRBY', KEYS[1], ARGV[1])
    return redis.call('GET', KEYS[1])
end
return false
"""
# Compare and set: KEYS[1] the key, ARGV[1] the data read, ARGV[2] the new data, ARGV[3] (if
# given) its lifetime in ms, 0 for none; without ARGV[3] the TTL is kept. 1 if the key still held
# the data read (and now holds the new data), else 0. The fallback of an ``incr`` past 64 bits
# (django-redis's read-modify-write, made safe against a concurrent write) and of an ``add`` that
# found a value it cannot read (which counts as absent).
SWAP_IF_SAME = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
    return 0
end
if ARGV[3] == nil then
    redis.call('SET', KEYS[1], ARGV[2], 'KEEPTTL')
elseif ARGV[3] == '0' then
    redis.call('SET', KEYS[1], ARGV[2])
else
    redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
end
return 1
"""
# SET with PX for many keys in one command: KEYS are the keys, ARGV[1] the milliseconds, then
# the values. Sent as EVAL (the server caches it by its SHA1), so no NOSCRIPT round trip.
SET_EACH = """
local ms = ARGV[1]
for i, key in ipairs(KEYS) do
    redis.call('SET', key, ARGV[i + 1], 'PX', ms)
end
return #KEYS
"""
# Resharding: a delete is final. While PREVIOUS_MASTERS is set a copy of a key can be on its
# previous owner, and reads and the migration copy it to the owner. A delete therefore removes the
# previous owner's copy first, then deletes the key on its owner and leaves a *tombstone* there for
# TOMBSTONE_MS (DELETE_MARKED). Every copy onto an owner is refused where the key or its tombstone
# is (or the owner was cleared within TOMBSTONE_MS), and after its deadline: TOMBSTONE_MS, less a
# margin, after a moment no later than its read of the previous owner, on the owner's clock
# (:func:`copy_deadline`). A copy of a deleted value read the previous owner before the delete
# removed it there, so before the tombstone was written: it lands before the delete on the owner
# (which deletes it), or while the tombstone lives (refused), never later (its deadline is past).
# The reserved keys (tombstones, the clear mark) live on the owner, whatever the ring says.
RESERVED_PREFIX = "sentinel_cache:reshard:"
TOMBSTONE_PREFIX = RESERVED_PREFIX + "deleted:"  # + the key
CLEARED = RESERVED_PREFIX + "cleared"  # a shard's whole database flushed (clear() without prefix)
TOMBSTONE_MS = 10_000
CLOCK_MARGIN_MS = 1_000  # clocks of a shard's nodes (a copy may cross a failover) and rounding
# Scripts that read TIME and then write need effects replication, the default from Redis 7.0.
_EFFECTS = "if redis.replicate_commands then redis.replicate_commands() end\n"
# KEYS: the keys; ARGV[1]: the tombstone's ms, ARGV[2]: DEL or UNLINK. Returns the keys deleted.
DELETE_MARKED = f"""
local deleted = 0
for _, key in ipairs(KEYS) do
    redis.call('SET', '{TOMBSTONE_PREFIX}' .. key, '1', 'PX', ARGV[1])
    deleted = deleted + redis.call(ARGV[2], key)
end
return deleted
"""
# The one guard of every copy onto an owner; ARGV[1] is the copy's deadline (ms, owner's clock).
# blocked(key): 0 a value is there (newer: it stays), 2 deleted, 3 too late; false: copy it.
_GUARD = (
    _EFFECTS
    + f"""
local clock = redis.call('TIME')
local late = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000) >= tonumber(ARGV[1])
local cleared = redis.call('EXISTS', '{CLEARED}') == 1
local function blocked(key)
    if redis.call('EXISTS', key) == 1 then return 0 end
    if cleared or redis.call('EXISTS', '{TOMBSTONE_PREFIX}' .. key) == 1 then return 2 end
    if late then return 3 end
    return false
end
local done = {{}}
"""
)
# A read's copies: KEYS the keys; ARGV: deadline, then data and ttl_ms (0: no expiry) per key.
# Returns 1 (copied) or 0 (refused) per key.
COPY_MISSING = (
    _GUARD
    + """
for i, key in ipairs(KEYS) do
    if blocked(key) then
        done[i] = 0
    else
        local ttl = ARGV[2 * i + 1]
        if ttl == '0' then
            redis.call('SET', key, ARGV[2 * i])
        else
            redis.call('SET', key, ARGV[2 * i], 'PX', ttl)
        end
        done[i] = 1
    end
end
return done
"""
)
# The migration's copies (any type): KEYS the keys; ARGV: deadline, then ttl_ms (0: no expiry)
# and DUMP per key. Returns 1 (restored) or the guard's 0, 2 or 3 per key.
RESTORE_MISSING = (
    _GUARD
    + """
for i, key in ipairs(KEYS) do
    local why = blocked(key)
    if why then
        done[i] = why
    else
        redis.call('RESTORE', key, ARGV[2 * i], ARGV[2 * i + 1])
        done[i] = 1
    end
end
return done
"""
)
# Each key's remaining TTL in ms and its DUMP, read at once (one command, one consistent view):
# how a hash, set or sorted set (or any key) is read from its previous owner.
DUMP_WITH_TTL = """
local out = {}
for i, key in ipairs(KEYS) do
    out[2 * i - 1] = redis.call('PTTL', key)
    out[2 * i] = redis.call('DUMP', key)
end
return out
"""
# Sent as EVALSHA: the body goes over the wire (and through the server's SHA1) only when a
# server answers NOSCRIPT (first use, restart, failover to a fresh replica, SCRIPT FLUSH).
INCR_IF_EXISTS_SHA = hashlib.sha1(INCR_IF_EXISTS.encode()).hexdigest()


def copy_deadline(clock: Sequence[Any], elapsed: float) -> int:
    """A copy's deadline on its owner's clock, from the owner's ``TIME`` reply read in the same
    round trip as the previous owner's copy (``elapsed`` seconds, measured around it): that
    ``TIME`` ran at most ``elapsed`` after the copy was read, so the deadline is no later than
    :data:`TOMBSTONE_MS` after that read."""
    now_ms = int(clock[0]) * 1000 + int(clock[1]) // 1000
    return now_ms - math.ceil(elapsed * 1000) - CLOCK_MARGIN_MS + TOMBSTONE_MS


def is_reserved(key: Any) -> bool:
    """A key of ours (a tombstone, the clear mark), not the cache's: never moved."""
    prefix = RESERVED_PREFIX.encode() if isinstance(key, bytes) else RESERVED_PREFIX
    return isinstance(key, (bytes, str)) and key.startswith(prefix)  # type: ignore[arg-type]
