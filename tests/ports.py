"""Free loopback ports for tests that start ``python -m sentinel_cache.testing up``: only
tests/test_dev_demo.py uses its default ports, which it needs free to check them."""

from __future__ import annotations

import random
import socket


def free_port_base(count: int) -> int:
    """A base with ``count`` consecutive free loopback ports, below the ephemeral range."""
    rng = random.SystemRandom()
    for _ in range(200):
        base = rng.randrange(20000, 32000 - count)
        socks = []
        try:
            for port in range(base, base + count):
                sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                socks.append(sock)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                sock.bind(("127.0.0.1", port))
        except OSError:
            continue
        finally:
            for sock in socks:
                sock.close()
        return base
    raise RuntimeError("no free port range found")
