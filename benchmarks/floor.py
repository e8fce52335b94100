"""The floor: the least a Python client can do for a cache call, as a benchmark contender.

Blocking sockets (``socket.create_connection``, ``TCP_NODELAY``), one ``hiredis.Reader`` per
connection, RESP packed by hand with every command header built once (only the key and value
bytes are packed per call), values pickled as every contender's are (ints stored as digits, as
redis-py's ``INCR`` needs). Over several masters each key goes to the master our ring picks (the
same placement as ``redis-py, 4 masters by our ring`` and as ours), and every shard's batch is
sent before any reply is read. Same semantics as the other contenders: ``set`` with the same
timeout (``SET ... EX``), ``get_many`` returns a dict of the keys found, ``delete_many`` the
number deleted, ``incr`` the new value; an error reply is raised.

Thread-safe (the mixed workload shares one object between threads): each call takes one set of
connections (one per master) from a free list and gives it back, or closes it if the call
failed half-way (an unread reply must never reach the next caller). The async calls use
asyncio streams on connections of their own, opened in the running loop.
"""

from __future__ import annotations

import asyncio
import pickle
import socket
from collections.abc import Mapping, Sequence
from typing import Any

import hiredis

from benchmarks.contender import NODE_KWARGS, TIMEOUT, Contender, Topology

_EX = b"$2\r\nEX\r\n$%d\r\n%d\r\n" % (len(str(TIMEOUT)), TIMEOUT)  # "EX 300", packed once
_GET = b"*2\r\n$3\r\nGET\r\n"
_SET = b"*5\r\n$3\r\nSET\r\n"
_INCRBY_1 = b"\r\n$1\r\n1\r\n"
_INCRBY = b"*3\r\n$6\r\nINCRBY\r\n"
_ReplyError = hiredis.ReplyError


def _bulk(data: bytes) -> bytes:
    return b"$%d\r\n%b\r\n" % (len(data), data)


def _incr(key: str) -> bytes:
    """``INCRBY key 1``, packed."""
    encoded = key.encode()
    return _INCRBY + b"$%d\r\n%b" % (len(encoded), encoded) + _INCRBY_1


class _Conn:
    """One socket and its reply parser."""

    __slots__ = ("sock", "parser")

    def __init__(self, address: tuple[str, int]) -> None:
        sock = socket.create_connection(address, timeout=NODE_KWARGS["socket_connect_timeout"])
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.settimeout(NODE_KWARGS["socket_timeout"])
        self.sock = sock
        self.parser = hiredis.Reader()

    def reply(self) -> Any:
        """The next reply (reading as much as has arrived); an error reply is raised."""
        parser = self.parser
        reply = parser.gets()
        while reply is False:
            data = self.sock.recv(65536)
            if not data:
                raise ConnectionError("the server closed the connection")
            parser.feed(data)
            reply = parser.gets()
        if type(reply) is _ReplyError:
            raise reply
        return reply


class Floor(Contender):
    """The floor over one or several masters (see the module doc)."""

    has_async = True

    def __init__(self, addresses: Sequence[tuple[str, int]]) -> None:
        from sentinel_cache.core.ring import HashRing

        self.addresses: list[tuple[str, int]] = [(h, p) for h, p in addresses]
        self.one = len(self.addresses) == 1
        self._index = HashRing([1] * len(self.addresses)).shard_index
        self._free: list[list[_Conn]] = []  # list.pop/append are atomic: no lock needed
        self._afree: dict[Any, list[list[Any]]] = {}  # per event loop
        self._mget: dict[int, bytes] = {}  # command headers by number of keys, built once
        self._del: dict[int, bytes] = {}

    # -- connections -----------------------------------------------------------------------

    def _take(self) -> list[_Conn]:
        try:
            return self._free.pop()
        except IndexError:
            return [_Conn(a) for a in self.addresses]

    def _header(self, cache: dict[int, bytes], name: bytes, count: int) -> bytes:
        header = cache.get(count)
        if header is None:
            header = cache[count] = b"*%d\r\n%b" % (count + 1, _bulk(name))
        return header

    def _groups(self, keys: Sequence[str]) -> dict[int, list[str]]:
        if self.one:
            return {0: list(keys)}
        index = self._index
        groups: dict[int, list[str]] = {}
        for key in keys:
            groups.setdefault(index(key), []).append(key)
        return groups

    @staticmethod
    def _drop(conns: list[_Conn]) -> None:
        """Close a set of connections a call failed on: a reply may be left unread on them."""
        for conn in conns:
            conn.sock.close()

    def _single(self, key: str, command: bytes) -> Any:
        conns = self._take()
        conn = conns[0] if self.one else conns[self._index(key)]
        try:
            conn.sock.sendall(command)
            reply = conn.reply()
        except BaseException:
            self._drop(conns)
            raise
        self._free.append(conns)
        return reply

    def _batches(self, batches: Sequence[tuple[int, bytes, int]]) -> list[list[Any]]:
        """Send every shard's batch, then read each shard's ``count`` replies."""
        conns = self._take()
        try:
            for shard, data, _ in batches:
                conns[shard].sock.sendall(data)
            out = []
            for shard, _, count in batches:
                conn = conns[shard]
                out.append([conn.reply() for _ in range(count)])
        except BaseException:
            self._drop(conns)
            raise
        self._free.append(conns)
        return out

    # -- the operations ---------------------------------------------------------------------

    def get(self, key: str) -> Any:
        data = self._single(key, _GET + _bulk(key.encode()))
        if data is None:
            return None
        return int(data) if data.isdigit() else pickle.loads(data)

    def set(self, key: str, value: Any) -> Any:
        data = (
            str(value).encode()
            if type(value) is int
            else pickle.dumps(value, pickle.HIGHEST_PROTOCOL)
        )
        return self._single(key, _SET + _bulk(key.encode()) + _bulk(data) + _EX) == b"OK"

    def get_many(self, keys: Sequence[str]) -> Any:
        groups = self._groups(keys)
        batches = [
            (
                shard,
                self._header(self._mget, b"MGET", len(group))
                + b"".join([_bulk(k.encode()) for k in group]),
                1,
            )
            for shard, group in groups.items()
        ]
        found = {}
        loads = pickle.loads
        for group, (values,) in zip(groups.values(), self._batches(batches), strict=True):
            for key, value in zip(group, values, strict=True):
                if value is not None:
                    found[key] = int(value) if value.isdigit() else loads(value)
        return found

    def set_many(self, mapping: Mapping[str, Any]) -> Any:
        dumps, high = pickle.dumps, pickle.HIGHEST_PROTOCOL
        batches = [
            (
                shard,
                b"".join(
                    [_SET + _bulk(k.encode()) + _bulk(dumps(mapping[k], high)) + _EX for k in group]
                ),
                len(group),
            )
            for shard, group in self._groups(list(mapping)).items()
        ]
        return all(r == b"OK" for replies in self._batches(batches) for r in replies)

    def delete_many(self, keys: Sequence[str]) -> Any:
        batches = [
            (
                shard,
                self._header(self._del, b"DEL", len(group))
                + b"".join([_bulk(k.encode()) for k in group]),
                1,
            )
            for shard, group in self._groups(keys).items()
        ]
        return sum(replies[0] for replies in self._batches(batches))

    def incr(self, key: str) -> Any:
        return self._single(key, _incr(key))

    # -- async: asyncio streams, the same commands --------------------------------------------

    async def _asingle(self, key: str, command: bytes) -> Any:
        return await self._ashard(0 if self.one else self._index(key), command)

    async def _ashard(self, shard: int, command: bytes) -> Any:
        """One command's round trip on master ``shard``, on the running loop's connections."""
        free = self._afree.setdefault(asyncio.get_running_loop(), [])
        try:
            conns = free.pop()
        except IndexError:
            conns = []
            for host, port in self.addresses:
                reader, writer = await asyncio.open_connection(host, port)
                writer.get_extra_info("socket").setsockopt(
                    socket.IPPROTO_TCP, socket.TCP_NODELAY, 1
                )
                conns.append((reader, writer, hiredis.Reader()))
        reader, writer, parser = conns[shard]
        try:
            writer.write(command)
            reply = parser.gets()
            while reply is False:
                data = await reader.read(65536)
                if not data:
                    raise ConnectionError("the server closed the connection")
                parser.feed(data)
                reply = parser.gets()
            if type(reply) is _ReplyError:
                raise reply
        except BaseException:
            for _, dropped, _ in conns:
                dropped.close()
            raise
        free.append(conns)
        return reply

    async def aget(self, key: str) -> Any:
        data = await self._asingle(key, _GET + _bulk(key.encode()))
        if data is None:
            return None
        return int(data) if data.isdigit() else pickle.loads(data)

    async def aset(self, key: str, value: Any) -> Any:
        data = (
            str(value).encode()
            if type(value) is int
            else pickle.dumps(value, pickle.HIGHEST_PROTOCOL)
        )
        command = _SET + _bulk(key.encode()) + _bulk(data) + _EX
        return await self._asingle(key, command) == b"OK"

    async def aget_many(self, keys: Sequence[str]) -> Any:
        found = {}
        loads = pickle.loads
        for shard, group in self._groups(keys).items():
            command = self._header(self._mget, b"MGET", len(group)) + b"".join(
                [_bulk(k.encode()) for k in group]
            )
            for key, value in zip(group, await self._ashard(shard, command), strict=True):
                if value is not None:
                    found[key] = int(value) if value.isdigit() else loads(value)
        return found

    async def aincr(self, key: str) -> Any:
        return await self._asingle(key, _incr(key))

    async def aclose(self) -> None:
        """Close the running loop's connections (they cannot outlive it)."""
        for conns in self._afree.pop(asyncio.get_running_loop(), []):
            for _, writer, _ in conns:
                writer.close()
                await writer.wait_closed()

    def close(self) -> None:
        while self._free:
            for conn in self._free.pop():
                conn.sock.close()


def floor_one(topo: Topology) -> Contender:
    """The floor on the first master alone."""
    return Floor(topo.master_addresses[:1])


def floor_sharded(topo: Topology) -> Contender:
    """The floor on every master, keys placed by our ring."""
    return Floor(topo.master_addresses)
