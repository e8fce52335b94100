"""When a connection may take the lean path, and redis-py's error when its socket fails: the
rules :class:`~sentinel_cache.core.topology.lean.LeanIO` (sync) and
:class:`~sentinel_cache.core.ops.async_clients.AsyncLeanIO` (asyncio) share, decided once.

Why here, without a socket or an event loop: both paths read replies with the parser's own
``hiredis.Reader`` and must refuse the same cases (anything that reader cannot be trusted
with alone) and fail with redis-py's errors; two copies of that drift apart.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

#: redis-py's words for a connection the node closed (its ``SERVER_CLOSED_CONNECTION_ERROR``).
CLOSED = "Connection closed by server."
#: What the socket raises when the node reset the connection or it broke under a write.
_RESETS = (ConnectionResetError, BrokenPipeError)

try:
    import hiredis

    _HIREDIS_READER: Any = hiredis.Reader
except ImportError:  # pragma: no cover - without hiredis every call takes redis-py's path
    _HIREDIS_READER = None


#: The most elements a reply's aggregate (array, map, set, push, attribute) may declare. The
#: parser allocates a declared aggregate whole before any element arrives, and freeing a huge
#: one holds the interpreter's lock for seconds (a ``*2147483647`` froze every thread for 5 s
#: and more): no cache call reads anything near this many in one reply.
MAX_REPLY_ELEMENTS = 1 << 24
#: A server's ``proto-max-bulk-len`` unless configured: the largest bulk string it accepts (and
#: the bound on one a reply may declare, unless the master allows larger).
DEFAULT_BULK_LIMIT = 512 * 1024 * 1024
#: The smallest ``proto-max-bulk-len`` Redis and Valkey accept: a batch no larger than this
#: cannot hold an argument over any master's limit, so only a larger one is looked at.
MIN_BULK_LIMIT = 1024 * 1024
#: The reply guard's view of a chunk, one byte per byte (``bytes.translate``, C speed): a digit
#: ``0``, an aggregate's type byte ``A``, a bulk string's ``B``, a line feed ``N``, anything
#: else ``x``. A header declaring a large size is then found with ``bytes.find``.
_SHAPES = bytes(
    ord("0")
    if byte in b"0123456789"
    else ord("A")
    if byte in b"*%~>|"
    else ord("B")
    if byte in b"$=!"
    else ord("N")
    if byte == 10
    else ord("x")
    for byte in range(256)
)
#: An aggregate declaring 8 digits or more, a bulk string 9 or more: looked at closer.
_AGGREGATE = b"A" + b"0" * 8
_BULK = b"B" + b"0" * 9
_LARGE = ((_AGGREGATE, "aggregate"), (_BULK, "bulk"))
#: A line's start left incomplete at the end of a chunk, kept to be looked at with the next.
_TYPE_BYTES = frozenset(b"*%~>|$=!")
_CARRY = 24


#: The reply guard's carry when the last chunk ended at a line's end (a new connection too).
LINE_START = b"\n"
_CLEAN: tuple[str | None, bytes] = (None, LINE_START)


def oversized(data: Any, end: int, carry: bytes, bulk_limit: int) -> tuple[str | None, bytes]:
    """The reply guard, run on every chunk read before the parser is fed ``data[:end]``: what
    makes the chunk hostile, or None; and the carry for the next chunk: :data:`LINE_START` if
    this one ended at a line's end, the start of a header it ended in, else empty (``carry`` is
    the previous chunk's, :data:`LINE_START` on a new connection).

    Hostile: a header at a line's start declaring an aggregate (array, map, set, push,
    attribute) of more than :data:`MAX_REPLY_ELEMENTS` elements, which the parser would allocate
    whole at once; or, at the chunk's start (a reply's own header), a bulk string over
    ``bulk_limit`` (the master's ``proto-max-bulk-len``, or the default if larger: a value
    written before the limit was lowered is still read). A bulk string inside a reply is not
    allocated before its bytes arrive: :func:`overfull` bounds those. One ``find`` per
    aggregate type byte, in C: a Python parser of the whole reply would cost more than the
    reply. A header is looked for at every line's start, so a value holding a line that reads
    as one (``\\r\\n*123456789``) is refused as well."""
    if end <= _TINY and carry == LINE_START and data[end - 1] == 10:
        return _CLEAN  # whole lines too short to hold a size looked at closer (+OK, :1, $-1)
    if end <= _SMALL or (carry and carry != LINE_START):  # (or a header cut at the last end)
        # A small chunk (most replies): one translate and two finds are cheaper than five.
        chunk = data if end == len(data) else data[:end]
        shapes = chunk.translate(_SHAPES)
        if carry == LINE_START and _AGGREGATE not in shapes and _BULK not in shapes:
            return _CLEAN if shapes[-1:] == b"N" else (None, _tail(chunk, end, carry))
        return _closer(chunk, shapes, carry, bulk_limit)
    at_start = bool(carry)
    # (a size of 9 digits or more has a digit 9 bytes after its type byte: looked at closer)
    if at_start and end > 9 and data[0] in _BULK_TYPES and 48 <= data[9] <= 57:
        found = _declared(data, 0, end, bulk_limit)
        if found is not None:
            return found, b""
    for byte in _AGGREGATE_TYPES:
        at = data.find(byte, 0, end)
        hits = 0
        while at >= 0:
            # at a line's start, with 8 digits or more (a digit 8 bytes after the type byte)
            if (
                (at_start if at == 0 else data[at - 1] == 10)
                and at + 8 < end
                and 48 <= data[at + 8] <= 57
            ):
                found = _declared(data, at, end, bulk_limit)
                if found is not None:
                    return found, b""
            hits += 1
            if hits > _HITS:  # a value full of them: one scan of the whole chunk instead
                chunk = data if end == len(data) else data[:end]
                return _closer(chunk, chunk.translate(_SHAPES), carry, bulk_limit)
            at = data.find(byte, at + 1, end)
    if not end or data[end - 1] == 10:
        return _CLEAN  # the usual chunk: whole lines, no large size declared
    return None, _tail(data, end, carry)


def overfull(buffered: int, bulk_limit: int) -> str | None:
    """What is wrong when the parser holds ``buffered`` bytes of an unfinished reply item: more
    than any bulk string the master can hold (``bulk_limit``, at least the default, and a
    chunk's slack), so whatever declared it lied; else None. The parser keeps only the item it
    waits for (it drops what it consumed), so one look per chunk read bounds the memory a
    reply can take to the largest value the master can hold."""
    bound = max(bulk_limit, DEFAULT_BULK_LIMIT) + _SLACK
    if buffered <= bound:
        return None
    return f"sent a reply item of more than {bound} bytes, more than the master can hold"


#: A chunk this small that starts and ends at a line's end is clean: a header looked at
#: closer (an aggregate's 8 digits, a bulk string's 9) takes 10 bytes with a bare line feed.
_TINY = 9
#: A chunk this small is looked at through one ``translate`` (see ``_SHAPES``), a larger one
#: with a ``find`` per aggregate type byte.
_SMALL = 4096
#: What ``overfull`` allows over the largest bulk string: the parser's consumed bytes it keeps
#: until it compacts (1 KiB) and a chunk read on top.
_SLACK = 1024 * 1024
_AGGREGATE_TYPES = (b"*", b"%", b"~", b">", b"|")
_BULK_TYPES = frozenset(b"$=!")
#: Type bytes at a line's start looked at one by one in a chunk; more, and the chunk is scanned
#: once (``translate``) instead.
_HITS = 32


def _declared(data: Any, at: int, end: int, bulk_limit: int) -> str | None:
    """The header at ``at`` if it declares more than its bound (an aggregate's 8 digits or
    more, a bulk string's 9 or more are read), else None."""
    kind = "aggregate" if data[at] in b"*%~>|" else "bulk"
    least = 8 if kind == "aggregate" else 9
    digits = bytes(data[at + 1 : min(end, at + 1 + 20)])
    count = len(digits) - len(digits.lstrip(b"0123456789"))
    if count < least:
        return None
    return _over(kind, chr(data[at]), int(digits[:count]), bulk_limit)


def _tail(data: Any, end: int, carry: bytes) -> bytes:
    """The carry of a chunk ending inside a line: that line's start if it may be a header."""
    start = max(0, end - _CARRY)
    tail = bytes(data[start:end])
    line = tail.rfind(b"\n")
    if line >= 0:
        tail = tail[line + 1 :]
    elif start or carry != LINE_START:  # a line longer than any header, or one that is none
        return b""
    if len(tail) <= _CARRY and tail[0] in _TYPE_BYTES and (len(tail) == 1 or tail[1:].isdigit()):
        return tail
    return b""


def _closer(chunk: Any, shapes: Any, carry: bytes, bulk_limit: int) -> tuple[str | None, bytes]:
    """:func:`oversized` for a chunk that may declare a large size or does not start or end at
    a line's end."""
    end = len(chunk)
    at_line_start = carry == LINE_START
    if carry and not at_line_start:  # a header's start: looked at with what follows it
        head = carry + bytes(chunk[:_CARRY])
        found = _hostile(head, head.translate(_SHAPES), bulk_limit, True)
        if found is not None:
            return found, b""
    found = _hostile(chunk, shapes, bulk_limit, at_line_start)
    if found is not None:
        return found, b""
    if not end or chunk[end - 1] == 10:
        return None, LINE_START
    if not at_line_start and carry:  # a header's start that may go on in this chunk
        if b"\n" not in bytes(chunk[-_CARRY:]) and len(carry) + end <= _CARRY:
            tail = carry + bytes(chunk)
            if tail[1:].isdigit():
                return None, tail
        return None, _tail(chunk, end, b"")
    return None, _tail(chunk, end, carry)


def _hostile(chunk: Any, shapes: Any, bulk_limit: int, at_line_start: bool) -> str | None:
    """What the first large header at a line's start of ``chunk`` declares over its bound
    (``at_line_start``: whether the chunk's first byte starts a line), or None."""
    end = len(chunk)
    for marker, kind in _LARGE:
        at = shapes.find(marker)
        while at >= 0:
            if at_line_start if at == 0 else shapes[at - 1] == 78:  # "N": after a line feed
                stop = at + len(marker)
                while stop < end and stop - at <= 20 and shapes[stop] == 48:  # 20 digits: huge
                    stop += 1
                declared = int(chunk[at + 1 : stop])
                found = _over(kind, chunk[at : at + 1].decode("latin-1"), declared, bulk_limit)
                if found is not None:
                    return found
            at = shapes.find(marker, at + 1)
    return None


def _over(kind: str, type_byte: str, declared: int, bulk_limit: int) -> str | None:
    if kind == "aggregate":
        if declared <= MAX_REPLY_ELEMENTS:
            return None
        return (
            f"declared an aggregate ({type_byte}) of {declared} elements, "
            f"over the bound of {MAX_REPLY_ELEMENTS}"
        )
    bound = max(bulk_limit, DEFAULT_BULK_LIMIT)  # values written under a higher default
    if declared <= bound:
        return None
    return (
        f"declared a bulk string ({type_byte}) of {declared} bytes, over the "
        f"bound of {bound} (the master's proto-max-bulk-len, at least 512 MiB)"
    )


def bulk_limit_of(reply: Any) -> int:
    """The ``proto-max-bulk-len`` in a ``CONFIG GET proto-max-bulk-len`` reply (RESP2 list or
    RESP3 map), else :data:`DEFAULT_BULK_LIMIT` (refused, renamed away, or garbage)."""
    if isinstance(reply, dict):
        items = list(reply.values())
    elif isinstance(reply, list) and len(reply) == 2:
        items = reply[1:]
    else:
        return DEFAULT_BULK_LIMIT
    try:
        value = int(items[0])
    except (TypeError, ValueError, IndexError):
        return DEFAULT_BULK_LIMIT
    return value if value >= MIN_BULK_LIMIT else DEFAULT_BULK_LIMIT


def too_large(commands: Any, limit: int) -> tuple[Any, int] | None:
    """The key and size of the first argument of ``commands`` over ``limit`` bytes (the
    master's ``proto-max-bulk-len``: it would refuse it after reading it whole), or None. The
    key is the command's first argument, or for ``MSET``-like commands the one before the
    value."""
    for command in commands:
        for index, arg in enumerate(command):
            size = len(arg) if isinstance(arg, (bytes, bytearray, memoryview)) else 0
            if isinstance(arg, str) and len(arg) * 4 > limit:
                size = len(arg.encode("utf-8", "surrogatepass"))
            if size > limit:
                return _key_of(command, index), size
    return None


def _key_of(command: Any, index: int) -> Any:
    """The key an argument at ``index`` of ``command`` is written to: the one before it in an
    ``MSET``-like command; for a script (``SET_EACH``: ``ARGV[i + 1]`` is ``KEYS[i]``'s value)
    the key of the same rank; else the command's first argument."""
    name = command[0]
    name = (name.decode() if isinstance(name, bytes) else str(name)).upper()
    if name.startswith("MSET") and index >= 2:
        return command[index - 1]
    if name in ("EVAL", "EVALSHA") and len(command) > 3:
        try:
            count = int(command[2])
        except (TypeError, ValueError):
            count = 0
        keys = command[3 : 3 + count]
        rank = index - 3 - count  # ARGV[rank]: ARGV[1] the expiry, ARGV[i + 1] KEYS[i]'s
        if keys:
            return keys[rank - 1] if 1 <= rank <= len(keys) else keys[0]
    return command[min(1, len(command) - 1)]


class LeanReader(NamedTuple):
    """A parser's ``hiredis.Reader`` fit for the lean path, its "no reply yet" value and the
    RESP3 push type (None for RESP2)."""

    reader: Any
    pending: Any
    push: Any


def lean_reader(parser: Any, protocol: Any, health_check_interval: Any) -> LeanReader | None:
    """The parser's reader for the lean path, or None where redis-py's own path must read: no
    hiredis reader, one holding data already (redis-py's parser owns it), a health check to run
    before commands, or RESP3 without what tells a push from a reply (hiredis >= 3.2 and
    redis-py's push handler; before redis-py 5.1 "no reply yet" was ``False``, a RESP3 reply)."""
    reader: Any = getattr(parser, "_reader", None)
    if type(reader) is not _HIREDIS_READER or reader.has_data() or health_check_interval:
        return None
    # Empty, the reader answers with its "not enough data" value: what reads wait on.
    pending = reader.gets()
    if protocol not in (3, "3"):
        return LeanReader(reader, pending, None)
    push = getattr(parser, "_hiredis_PushNotificationType", None)
    if push is None or not hasattr(parser, "handle_push_response") or pending is False:
        return None
    return LeanReader(reader, pending, push)


def broken(response: Any) -> BaseException | None:
    """The error redis-py's hiredis parser hands as a reply when the connection is unusable
    (alone, or first of a list: a reply it could not parse), to be raised as a socket failure,
    the socket dropped; None for any other reply (data, an error reply)."""
    if type(response) is list:
        first = response[0] if response else None
        return first if isinstance(first, RedisConnectionError) else None
    return response if isinstance(response, RedisConnectionError) else None


def closed_by_node(exc: BaseException) -> bool:
    """Whether ``exc`` says the node closed or reset the connection (an end of file, a reset, a
    broken pipe): what a node does to a client idle past its ``timeout``, to every client when
    the sentinels reconfigure it (``CLIENT KILL TYPE normal``) or when it restarts. A pooled
    connection learns it only when it is used (asyncio's, not even at checkout, until the loop
    has run), and a new connection to the same node may well succeed. Not a refused connect,
    a timeout (a hung node would cost a second one) or a refusal of credentials (subclasses)."""
    if isinstance(exc, _RESETS):
        return True
    if type(exc) is not RedisConnectionError:
        return False
    cause = exc.__cause__ or exc.__context__
    return str(exc) == CLOSED or isinstance(cause, _RESETS)


# The one rule of resending (the runner's ``run`` and ``scatter`` apply it, sync and asyncio):
# a command that cannot have run may be sent again whatever it does; one that may have run is
# sent again only if it is idempotent. "Cannot have run" is known only before any of its bytes
# left: the connect (or the pool's check at checkout) failed, or the connection was seen closed
# before the write (an end of file the event loop had already read, a transport closing). An
# end of file, a reset or a timeout after the write proves nothing: the node may have run it
# and closed before replying.
_UNSENT = "sentinel_cache_unsent"


def mark_unsent(exc: BaseException) -> BaseException:
    """``exc``, noted as a failure before any byte of the command left (see :func:`unsent`)."""
    setattr(exc, _UNSENT, True)
    return exc


def unsent(exc: BaseException) -> bool:
    """Whether ``exc`` was raised before any byte of the command left (:func:`mark_unsent`)."""
    return getattr(exc, _UNSENT, False) is True


def may_resend(exc: BaseException, idempotent: bool) -> bool:
    """Whether a command that failed with ``exc`` may be sent again: an idempotent one always
    (the safety net's other rules permitting), any other only if it was never sent."""
    return idempotent or unsent(exc)


def socket_failure(
    exc: BaseException, *, writing: bool, timed_out: bool, host: str, timeout_from: str
) -> BaseException:
    """redis-py's error for ``exc``, raised by the socket while writing a command or reading a
    reply (``exc`` itself if the socket did not raise it): a timeout (``timed_out``, asyncio's
    being a class of its own before Python 3.11) reading from ``timeout_from``, an ``OSError``
    while reading from ``host``, with redis-py's words and chaining."""
    error: BaseException
    if timed_out:
        error = RedisTimeoutError(
            "Timeout writing to socket" if writing else f"Timeout reading from {timeout_from}"
        )
        error.__cause__ = None
    elif isinstance(exc, OSError):
        if writing:
            args = exc.args
            errno, message = ("UNKNOWN", args[0] if args else exc) if len(args) < 2 else args[:2]
            error = RedisConnectionError(f"Error {errno} while writing to socket. {message}.")
        else:
            error = RedisConnectionError(f"Error while reading from {host} : {exc.args}")
        error.__cause__ = exc
    else:
        return exc
    error.__suppress_context__ = True
    return error
