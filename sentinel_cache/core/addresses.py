"""Where the cache's topology is: sentinel addresses, master names and their weights, parsed.

Kept apart from :mod:`sentinel_cache.core.config` (which re-exports :class:`Address`) so the
values that say where the shards are read on their own. :func:`bad_value` is the one
field-naming :class:`ConfigurationError` of these parsers, the options and the codec's checks.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NamedTuple

from sentinel_cache.core.ring import is_valid_weight
from sentinel_cache.exceptions import ConfigurationError


class Address(NamedTuple):
    """A ``(host, port)`` pair; formats as ``host:port`` (``[v6]:port`` for IPv6)."""

    host: str
    port: int

    def __str__(self) -> str:
        if ":" in self.host:
            return f"[{self.host}]:{self.port}"
        return f"{self.host}:{self.port}"


def bad_value(field_name: str, value: Any, why: str) -> ConfigurationError:
    """``field_name: why (got value)``, with the three parts as the error's attributes."""
    return ConfigurationError(option=field_name, value=value, reason=f"{why} (got {value!r})")


def parse_address(value: Any, field_name: str = "sentinels") -> Address:
    """Parse ``"host:port"``, ``"[v6]:port"`` or a ``(host, port)`` pair."""
    if isinstance(value, (tuple, list)):
        if len(value) != 2:
            raise bad_value(field_name, value, "an address pair must be (host, port)")
        host, port = value
        if not isinstance(host, str) or not host.strip():
            raise bad_value(field_name, value, "the host must be a non-empty string")
        return Address(host.strip(), _parse_port(port, field_name, value))
    if not isinstance(value, str):
        raise bad_value(field_name, value, 'expected "host:port" or (host, port)')
    text = value.strip()
    if text.startswith("["):
        end = text.find("]")
        if end < 0 or text[end + 1 : end + 2] != ":":
            raise bad_value(field_name, value, 'an IPv6 address must look like "[::1]:26379"')
        host, port_text = text[1:end], text[end + 2 :]
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise bad_value(field_name, value, "not a valid IPv6 address") from None
    else:
        host, sep, port_text = text.rpartition(":")
        if not sep or not host:
            raise bad_value(field_name, value, 'expected "host:port"')
        if ":" in host:
            raise bad_value(field_name, value, 'write an IPv6 address as "[addr]:port"')
    return Address(host, _parse_port(port_text, field_name, value))


def _parse_port(port: Any, field_name: str, whole: Any) -> int:
    if isinstance(port, bool):
        raise bad_value(field_name, whole, "the port must be an integer from 1 to 65535")
    try:
        number = int(port)
    except (TypeError, ValueError, OverflowError):  # OverflowError: an infinite float
        raise bad_value(field_name, whole, "the port must be an integer from 1 to 65535") from None
    if not 1 <= number <= 65535 or (isinstance(port, float) and port != number):
        raise bad_value(field_name, whole, "the port must be an integer from 1 to 65535")
    return number


def parse_sentinels(value: Any, field_name: str = "sentinels") -> tuple[Address, ...]:
    """Accept a list of addresses, or one comma-separated string of them; no duplicates."""
    if isinstance(value, str):
        items: list[Any] = [part for part in value.split(",") if part.strip()]
    elif isinstance(value, tuple) and len(value) == 2 and isinstance(value[1], int):
        items = [value]  # a single (host, port) pair
    elif isinstance(value, Iterable) and not isinstance(value, (bytes, Mapping)):
        items = list(value)
    else:
        raise bad_value(field_name, value, "expected a list of sentinel addresses")
    if not items:
        raise bad_value(field_name, value, "at least one sentinel address is required")
    addresses = tuple(parse_address(item, field_name) for item in items)
    seen: set[Address] = set()
    for address in addresses:
        if address in seen:
            raise bad_value(field_name, value, f"sentinel {address} is listed twice")
        seen.add(address)
    return addresses


def parse_masters(value: Any, field_name: str = "masters") -> tuple[str, ...]:
    if isinstance(value, str):
        value = [part.strip() for part in value.split(",")]
    if not isinstance(value, Iterable) or isinstance(value, (bytes, Mapping)):
        raise bad_value(field_name, value, "expected an ordered list of master names")
    names = list(value)
    if not names:
        raise bad_value(field_name, value, "at least one master name is required")
    seen: set[str] = set()
    for name in names:
        if not isinstance(name, str) or not name.strip():
            raise bad_value(
                field_name, value, f"every master name must be a non-empty string: {name!r}"
            )
        if name != name.strip() or any(ch.isspace() for ch in name):
            raise bad_value(field_name, value, f"master name {name!r} contains white space")
        if name in seen:
            raise bad_value(field_name, value, f"master name {name!r} is listed twice")
        seen.add(name)
    return tuple(names)


MAX_WEIGHT = 1000


def parse_weights(
    value: Any, masters: Sequence[str], field_name: str = "weights"
) -> tuple[int, ...]:
    if value is None:
        return (1,) * len(masters)
    if isinstance(value, Mapping):
        unknown = set(value) - set(masters)
        if unknown:
            raise bad_value(field_name, value, f"names no configured master: {sorted(unknown)}")
        value = [value.get(name, 1) for name in masters]
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        raise bad_value(field_name, value, "expected a list of positive integers, one per master")
    weights = list(value)
    if len(weights) != len(masters):
        raise bad_value(
            field_name, value, f"{len(weights)} weights for {len(masters)} masters; they must match"
        )
    for weight in weights:
        if not is_valid_weight(weight):  # the ring's rule; the count and bound are ours
            raise bad_value(
                field_name, value, f"every weight must be a positive integer: {weight!r}"
            )
        if weight > MAX_WEIGHT:
            # 160 virtual nodes per unit of weight: a typo here would stall start-up.
            raise bad_value(
                field_name, value, f"every weight must be at most {MAX_WEIGHT}: {weight!r}"
            )
    return tuple(weights)
