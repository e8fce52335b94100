"""Signed values: the signing key's check and the HMAC signer a signing codec uses.

Kept apart from the codec so the one piece that defends against a writable Redis (see
:mod:`sentinel_cache.core.serializers`, "Security note") can be read and reviewed alone.
"""

from __future__ import annotations

import hashlib
import hmac
from typing import Any

from sentinel_cache.core.addresses import bad_value

# Part of the storage format: changing it makes every signed value unreadable.
MAC_CONTEXT = b"sentinel_cache.core.serializers.Codec v1"


def check_signing_key(value: Any) -> bytes | None:
    """``SIGNING_KEY`` as bytes: a str (UTF-8 encoded) or bytes of at least 16 characters, or
    None. The key never appears in the error."""
    if value is None:
        return None
    if isinstance(value, str):
        value = value.encode("utf-8")
    if not isinstance(value, (bytes, bytearray)) or len(value) < 16:
        raise bad_value("SIGNING_KEY", "***", "must be a str or bytes of at least 16 characters")
    return bytes(value)


# --- signing ---------------------------------------------------------------------------------


class Signer:
    """HMAC-SHA256 (RFC 2104) from precomputed pad states.

    ``hmac.digest`` re-initialises OpenSSL's HMAC on every call (about 2.5 us on OpenSSL 3);
    copying two prepared SHA-256 states costs a quarter of that. The template states are never
    updated, only copied, so one signer is safe to share between threads.
    """

    __slots__ = ("_inner", "_outer")

    def __init__(self, signing_key: bytes) -> None:
        # Domain separation: the MAC key is derived, never the configured key itself.
        key = hmac.digest(signing_key, MAC_CONTEXT, "sha256").ljust(64, b"\0")
        self._inner = hashlib.sha256(bytes(b ^ 0x36 for b in key))
        self._outer = hashlib.sha256(bytes(b ^ 0x5C for b in key))

    def sign(self, data: bytes) -> bytes:
        inner = self._inner.copy()
        inner.update(data)
        outer = self._outer.copy()
        outer.update(inner.digest())
        return outer.digest()
