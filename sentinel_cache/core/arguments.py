"""The one rule for each argument of a cache call: keys, timeouts, ``incr`` deltas, fields,
scores and score ranges.

The core client applies them at its entry points and both adapters apply them where they make
keys and timeouts, so a bad argument is refused the same way everywhere, with an
:class:`~sentinel_cache.exceptions.InvalidArgumentError` naming it and its value, before
anything is sent (a NaN timeout must not become "expire at once" and delete the value).

The callers keep the usual argument on a fast path of a type check or two (see each function)
and call these only for the rest.
"""

from __future__ import annotations

import datetime
import math
import numbers
from collections.abc import Collection, Iterable
from typing import Any

from sentinel_cache.exceptions import ArgumentTypeError, ArgumentValueError

#: The longest timeout, in seconds. The server keeps an expiry as milliseconds since 1970 in a
#: signed 64-bit integer and refuses ``SET PX``/``PEXPIRE`` beyond ``2**63 - 1`` minus its clock
#: (about 9.22e15 s); this fixed bound (about 285 million years) is under that for any server
#: clock before the year 200,000.
MAX_TIMEOUT = 9 * 10**15
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
#: A stampede lock's shortest timeout (``lock_timeout``, ``STAMPEDE_LOCK_TIMEOUT``): one ms.
MIN_LOCK_TIMEOUT = 0.001


def number_problem(
    value: Any, *, minimum: float = 0.0, maximum: float | None = None, integer: bool = False
) -> str | None:
    """Why ``value`` is not a finite number (an int with ``integer``; never a bool) from
    ``minimum`` to ``maximum``, or None: the one check of every numeric option and of
    ``lock_timeout``. NaN passes every comparison, and an infinite wait overflows the thread
    and socket APIs."""
    kind = int if integer else (int, float)
    if (
        isinstance(value, bool)
        or not isinstance(value, kind)
        or not math.isfinite(value)
        or value < minimum
        or (maximum is not None and value > maximum)
    ):
        what = "an integer" if integer else "a finite number"
        return f"must be {what} >= {minimum:g}" + (f" and <= {maximum:g}" if maximum else "")
    return None


def valid_timeout(timeout: Any) -> int | float | None:
    """``timeout`` (seconds) if the cache takes it, else the argument error.

    None (never expires, in the core's terms) passes, and so does a real number that is finite
    and at most :data:`MAX_TIMEOUT`; zero or less passes too (the value expires at once). A bool
    is refused: ``True`` as a timeout is a mistake, not one second. Callers skip this for an
    int ``<= MAX_TIMEOUT``.
    """
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, numbers.Real):
        reason = "must be a number of seconds" + (", not a bool" * isinstance(timeout, bool))
        raise ArgumentTypeError("timeout", timeout, reason)
    number = int(timeout) if isinstance(timeout, numbers.Integral) else float(timeout)
    if not math.isfinite(number):
        raise ArgumentValueError("timeout", timeout, "must be a finite number of seconds")
    if number > MAX_TIMEOUT:
        raise ArgumentValueError(
            "timeout", timeout, f"must be at most {MAX_TIMEOUT} seconds (the server's range)"
        )
    return number


def valid_delta(delta: Any) -> int:
    """``delta`` of ``incr``/``decr`` if it is an int of the server's signed 64-bit range (not a
    bool, not a float or a numeric string), else the argument error. Callers skip this for
    such an int."""
    if isinstance(delta, bool) or not isinstance(delta, numbers.Integral):
        raise ArgumentTypeError("delta", delta, "must be an int")
    number = int(delta)
    if not INT64_MIN <= number <= INT64_MAX:
        raise ArgumentValueError("delta", delta, "must fit in a signed 64-bit integer")
    return number


def epoch_ms(argument: str, when: Any, unit_ms: int) -> int:
    """A moment as milliseconds since 1970: a ``datetime`` (a naive one is local time, as
    redis-py reads it), or a number of ``unit_ms`` milliseconds (1000: seconds)."""
    if isinstance(when, datetime.datetime):
        return int(when.timestamp() * 1000)
    if isinstance(when, bool) or not isinstance(when, (int, float)) or not math.isfinite(when):
        raise ArgumentTypeError(argument, when, "must be a datetime or a finite number since 1970")
    return valid_int(argument, int(when * unit_ms))


def check_key(key: Any) -> None:
    """The key error for a key that cannot be sent: neither str nor bytes(-like), or a str that
    is not valid Unicode (a lone surrogate has no UTF-8 bytes; pass bytes for arbitrary bytes).
    Callers skip this for bytes and ASCII str."""
    if isinstance(key, str):
        try:
            key.encode("utf-8")
        except UnicodeEncodeError as exc:
            reason = f"is not valid Unicode (a lone surrogate at position {exc.start})"
            raise ArgumentValueError("key", key, reason) from None
    elif not isinstance(key, (bytes, bytearray, memoryview)):
        raise key_type_error(key)


def key_type_error(key: Any) -> ArgumentTypeError:
    """The key error for a key of another type than str or bytes (the ring's too)."""
    return ArgumentTypeError("key", key, f"must be str or bytes, not {type(key).__name__}")


def distinct(keys: Iterable[Any]) -> dict[Any, None]:
    """``keys`` without repeats, in order (``dict.fromkeys``); an unhashable key (a list) gets
    the key error instead of ``unhashable type``."""
    try:
        return dict.fromkeys(keys)
    except TypeError:
        if isinstance(keys, Collection):
            for key in keys:
                check_key(key)
        raise


def check_field(argument: str, value: Any) -> None:
    """A hash field or set/sorted-set member name sent as it is: str, bytes, int or float (as
    redis-py sends them; a bool or None would be refused by the server's protocol or mean
    something else)."""
    if isinstance(value, bool) or not isinstance(value, (str, bytes, int, float)):
        raise ArgumentTypeError(
            argument, value, f"must be str, bytes, int or float, not {type(value).__name__}"
        )


def valid_score(argument: str, score: Any) -> int | float:
    """A sorted-set score (or ``zincrby``'s amount) to send: an int or a float, infinities
    included; another real number as a float. NaN is refused (the server keeps no NaN score),
    and so are a bool, a numeric string and anything else: ``True`` is no score."""
    if type(score) is float:
        if math.isnan(score):
            raise ArgumentValueError(argument, score, "must be a number, not NaN")
        return score
    if type(score) is int:
        return score
    if isinstance(score, bool) or not isinstance(score, numbers.Real):
        raise ArgumentTypeError(argument, score, f"must be a number, not {type(score).__name__}")
    return valid_score(
        argument, int(score) if isinstance(score, numbers.Integral) else float(score)
    )


def valid_bound(argument: str, bound: Any) -> Any:
    """A score range's ``min`` or ``max``: a number (as :func:`valid_score`) or the server's
    own syntax as a str or bytes (``"-inf"``, ``"+inf"``, ``"(1.5"`` for exclusive), which the
    server parses and refuses naming min or max."""
    if isinstance(bound, (str, bytes)):
        return bound
    return valid_score(argument, bound)


def valid_int(argument: str, value: Any, minimum: int = INT64_MIN) -> int:
    """An index, offset or count: an int (not a bool) of the server's signed 64-bit range, at
    least ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ArgumentTypeError(argument, value, f"must be an int, not {type(value).__name__}")
    number = int(value)
    if not minimum <= number <= INT64_MAX:
        raise ArgumentValueError(argument, value, f"must be from {minimum} to {INT64_MAX}")
    return number


def check_count(argument: str, value: Any, minimum: int | None) -> None:
    """A count sent as it is (``SPOP``, ``SRANDMEMBER``, ``SSCAN``): an int (not a bool) of at
    least ``minimum`` (None: any, e.g. ``SRANDMEMBER``'s negative count allows repeats)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ArgumentTypeError(argument, value, f"must be an int, not {type(value).__name__}")
    if minimum is not None and value < minimum:
        raise ArgumentValueError(argument, value, f"must be at least {minimum}")
