"""One thread per sentinel following failovers on pub/sub: the push path.

Events are hints. ``+switch-master`` is confirmed with ``ROLE`` before a shard moves; the
promotion announcements raise the shard's write fence so no write lands on a master that is
about to be abandoned; after every (re)subscribe every shard is re-checked through the sentinels,
because events sent while we were away are lost (one re-check covers the listeners that
subscribed before it began: :class:`SharedResync`). The pull path (``Discovery``, asked again by
the safety net and the housekeeping thread) stays as the net.

Trust model: only a sentinel can send these events (a sentinel refuses ``PUBLISH`` from its
clients on anything but its hello channel), and the sentinels are trusted for the topology.
``ROLE`` confirmation protects against stale, malformed or mistaken events (a replica, a dead
or unreachable address, another shard's master); it cannot unmask a server that lies about its
role, so a compromised sentinel, or anyone on the path to one without TLS, can redirect a shard.
Protect the sentinels with ``requirepass``/ACLs and TLS (``SENTINEL_PASSWORD``, ``SENTINEL_SSL``).
"""

from __future__ import annotations

import contextlib
import logging
import random
import socket
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import redis

from sentinel_cache.core.config import Address, connection_class_and_kwargs

if TYPE_CHECKING:
    from sentinel_cache.core.topology.shard import Shard

logger = logging.getLogger("sentinel_cache")

SWITCH = "+switch-master"
# Announced by the failover leader before and while it promotes a replica: hold writes.
FENCE_EVENTS = (
    "+selected-slave",
    "+failover-state-send-slaveof-noone",
    "+failover-state-wait-promotion",
    "+promoted-slave",
)
# SLAVEOF NO ONE has been sent to the chosen replica: a reply still in flight from the old master
# may acknowledge a write the promoted replica never got.
PROMOTION = "+failover-state-wait-promotion"
# The failover will not happen (or ended without a switch): release the writes.
ABORT_EVENTS = (
    "-failover-abort-not-elected",
    "-failover-abort-no-good-slave",
    "-failover-abort-slave-timeout",
    "-failover-abort-master-is-not-waiting",
    "-failover-abort-waiting-for-replication-ack",  # not in every server version; harmless
    "+failover-end-for-timeout",
)
# A replica went away, came back, appeared, or an old master rejoined as a replica: with
# READ_FROM_REPLICAS, re-check that shard's read rotation now rather than at the next tick.
REPLICA_EVENTS = ("+sdown", "-sdown", "+slave", "+convert-to-slave")
# An instance restarted (the sentinels saw its run_id change, about 10 s after): for a master,
# its data is gone unless it persists it; the core checks and reports it.
REBOOT = "+reboot"
CHANNELS = (SWITCH, *FENCE_EVENTS, *ABORT_EVENTS, *REPLICA_EVENTS, REBOOT)


def _keepalive_options() -> dict[int, int]:
    options: dict[int, int] = {}
    for name, value in (("TCP_KEEPIDLE", 2), ("TCP_KEEPINTVL", 1), ("TCP_KEEPCNT", 3)):
        if hasattr(socket, name):
            options[getattr(socket, name)] = value
    return options


def parse_switch(data: str) -> tuple[str, Address, Address]:
    """``<name> <old-ip> <old-port> <new-ip> <new-port>``; ValueError if malformed."""
    fields = data.split()
    if len(fields) != 5:
        raise ValueError(f"expected 5 fields, got {len(fields)}")
    name, old_ip, old_port, new_ip, new_port = fields
    return name, Address(old_ip, _port(old_port)), Address(new_ip, _port(new_port))


def parse_instance_event(data: str) -> str:
    """The master name in ``<type> <name> <ip> <port> [@ <master> <ip> <port>]``."""
    fields = data.split()
    if "@" in fields:
        at = fields.index("@")
        if len(fields) < at + 4:
            raise ValueError("truncated '@ <master> <ip> <port>' part")
        _port(fields[at + 3])
        return fields[at + 1]
    if len(fields) < 4 or fields[0] != "master":
        raise ValueError("expected '<type> <name> <ip> <port>'")
    _port(fields[3])
    return fields[1]


def _port(text: str) -> int:
    port = int(text)
    if not 1 <= port <= 65535:
        raise ValueError(f"port out of range: {text!r}")
    return port


class ListenerCore(Protocol):
    """What a listener needs from the core, and all it may touch (the core implements it)."""

    def shard_by_name(self, name: str) -> Shard | None: ...

    def on_switch_announced(
        self,
        shard: Shard,
        address: Address,
        *,
        source: str,
        received: float,
        sentinel: Address | None = None,
    ) -> None: ...

    def on_replica_event(self, shard: Shard) -> None: ...

    def on_reboot(self, shard: Shard, address: Address, *, source: str) -> None: ...

    def recheck(self, *, source: str) -> None: ...


#: ``resync(subscribed_at, source)``: ask the sentinels about every shard, events sent before
#: the monotonic time ``subscribed_at`` being lost.
Resync = Callable[[float, str], None]


class SharedResync:
    """The resync of one core's listeners: one re-check that began after a listener subscribed
    covers it, so listeners subscribing together (start-up, a sentinel back) ask once, not once
    each (every re-check asks every sentinel)."""

    def __init__(self, core: ListenerCore) -> None:
        self._core = core
        self._lock = threading.Lock()
        self._began = float("-inf")

    def __call__(self, subscribed_at: float, source: str) -> None:
        with self._lock:
            if self._began >= subscribed_at:
                return  # asked after this subscription: what it missed was in the answers
            self._began = time.monotonic()
            self._core.recheck(source=source)


#: How far past a deadline a listener wakes (a wait that ends on it might find it not passed).
_PAST = 0.01


class SentinelListener:
    """Subscribes to one sentinel and forwards failover events to the core."""

    def __init__(
        self,
        core: ListenerCore,
        address: Address,
        sentinel_kwargs: Mapping[str, Any],
        *,
        ping_interval: float = 1.0,
        resync: Resync | None = None,
    ) -> None:
        self.core = core
        self.address = address
        self._resync: Resync = resync or (lambda _at, source: core.recheck(source=source))
        self._kwargs = dict(sentinel_kwargs)
        self._ping_interval = ping_interval
        self._stop = threading.Event()
        self.connected = False
        self.connects = 0
        self.last_error: str | None = None
        self._client: redis.Redis | None = None
        self._thread = threading.Thread(
            target=self._run, name=f"sentinel_cache-listener-{address}", daemon=True
        )

    def __repr__(self) -> str:
        state = "connected" if self.connected else f"disconnected ({self.last_error})"
        return f"<SentinelListener {self.address} {state} connects={self.connects}>"

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 5.0, *, wait: bool = True) -> None:
        self._stop.set()
        client = self._client
        if client is not None:
            client.connection_pool.disconnect()
        if wait and self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def _connect(self) -> Any:
        base, options = connection_class_and_kwargs(self._kwargs)
        stopped = self._stop

        class ListenerConnection(base):  # type: ignore[valid-type,misc]
            """Refuses to connect once the listener is stopped: redis-py's subscription
            reconnects on its own after the close that :meth:`stop` makes (its retry's
            failure step), and that connect's handshake held a close for its 2 s timeout."""

            def connect(self, *args: Any, **kwargs: Any) -> Any:
                if stopped.is_set():
                    raise redis.ConnectionError("the listener is stopped")
                return super().connect(*args, **kwargs)

        options["socket_timeout"] = max(float(options.get("socket_timeout") or 0), 2.0)
        options.update(socket_keepalive=True, socket_keepalive_options=_keepalive_options())
        pool = redis.ConnectionPool(
            host=self.address.host,
            port=self.address.port,
            connection_class=ListenerConnection,
            max_connections=2,
            **options,
        )
        self._client = redis.Redis(connection_pool=pool)
        pubsub = self._client.pubsub()
        pubsub.subscribe(*CHANNELS)
        return pubsub

    def _run(self) -> None:
        backoff = 0.05
        while not self._stop.is_set():
            pubsub = None
            try:
                pubsub = self._connect()
                self._listen(pubsub)
                backoff = 0.05
            except Exception as exc:  # any failure: note it, back off, reconnect
                if self._stop.is_set():
                    break
                if self.connected or self.last_error is None:
                    logger.warning(
                        "listener on sentinel %s disconnected: %s: %s",
                        self.address,
                        type(exc).__name__,
                        exc,
                    )
                self.last_error = f"{type(exc).__name__}: {exc}"
            finally:
                self.connected = False
                if pubsub is not None:
                    with contextlib.suppress(Exception):  # already failing; closing is best effort
                        pubsub.close()
                if self._client is not None:
                    self._client.connection_pool.disconnect()
            self._stop.wait(backoff * random.uniform(0.5, 1.5))
            backoff = min(backoff * 2, 2.0)

    def _listen(self, pubsub: Any) -> None:
        """Read until stopped. A sentinel that leaves a ``PING`` unanswered for
        ``ping_interval + 1`` s is gone (noticed within ``2 * ping_interval + 1`` s of falling
        silent, as before). The silence is counted from the ``PING``, and only once the socket
        has nothing left to read: a process starved of CPU (many processes on few cores, all
        woken by one failover) finds the answer and the events waiting in its buffer, where
        counting from the last message read would drop a healthy subscription, with what it
        had not read yet, and make it resubscribe and ask every sentinel again.

        Subscribed, it waits for a message until the next ``PING`` is due or the silence would
        pass its bound, whichever comes first: about two wake-ups a second when idle (the
        ``PING`` and its answer), not one every 0.2 s, in each process and for each sentinel.
        :meth:`stop` closes the socket, which ends the wait at once."""
        last_ping = 0.0
        unanswered: float | None = None  # when the oldest PING not answered yet was sent
        subscribed = 0
        interval, bound = self._ping_interval, self._ping_interval + 1.0
        began = time.monotonic()  # the confirmations are due within the same bound
        while not self._stop.is_set():
            now = time.monotonic()
            if now - last_ping >= interval and subscribed:
                pubsub.ping()
                last_ping = now
                if unanswered is None:
                    unanswered = now
            if subscribed:
                until = last_ping + interval
                if unanswered is not None:
                    until = min(until, unanswered + bound + _PAST)
                wait = min(max(until - now, _PAST), interval)
            else:  # the subscriptions' confirmations, due at once
                wait = min(0.2, interval)
            message = pubsub.get_message(timeout=wait)
            if message is None:
                if not subscribed:  # a reply cut short (or none) would be waited for forever
                    silent = time.monotonic() - began
                    if silent > bound:
                        raise TimeoutError(f"no subscription confirmed for {silent:.1f}s")
                    continue
                silent = 0.0 if unanswered is None else time.monotonic() - unanswered
                if silent > bound:
                    raise TimeoutError(f"no answer for {silent:.1f}s")
                continue
            unanswered = None  # anything from the sentinel shows the link alive
            last_seen = time.monotonic()
            kind = message.get("type")
            if kind == "subscribe":
                subscribed += 1
                if subscribed == len(CHANNELS):
                    self._on_subscribed()
            elif kind == "message":
                self.handle(message.get("channel"), message.get("data"), received=last_seen)

    def _on_subscribed(self) -> None:
        subscribed_at = time.monotonic()
        self.connected = True
        self.connects += 1
        self.last_error = None
        if self.connects > 1:
            logger.info("listener on sentinel %s reconnected", self.address)
        # Events sent while we were away are gone: ask the sentinels again.
        self._resync(subscribed_at, f"resync after subscribing to {self.address}")

    def handle(self, channel: Any, data: Any, *, received: float | None = None) -> None:
        """Dispatch one pub/sub message; malformed or foreign ones are logged and dropped."""
        received = time.monotonic() if received is None else received
        try:
            channel_text = channel.decode() if isinstance(channel, bytes) else str(channel)
            text = data.decode() if isinstance(data, bytes) else str(data)
            if channel_text == SWITCH:
                name, _old, new = parse_switch(text)
                shard = self.core.shard_by_name(name)
                # Every sentinel announces a switch: once one announcement moved the shard
                # there (and released its writes), the others have nothing left to ask.
                if shard is not None and (shard.address != new or shard.fenced):
                    self.core.on_switch_announced(
                        shard,
                        new,
                        source=f"+switch-master from {self.address}",
                        received=received,
                        sentinel=self.address,
                    )
            elif channel_text == REBOOT:
                fields = text.split()
                if fields[:1] == ["master"]:  # a replica's restart loses nothing
                    name = parse_instance_event(text)
                    shard = self.core.shard_by_name(name)
                    if shard is not None:
                        address = Address(fields[2], _port(fields[3]))
                        self.core.on_reboot(shard, address, source=f"+reboot from {self.address}")
            elif channel_text in (*FENCE_EVENTS, *ABORT_EVENTS, *REPLICA_EVENTS):
                name = parse_instance_event(text)
                shard = self.core.shard_by_name(name)
                if shard is None:
                    return
                if channel_text in REPLICA_EVENTS:
                    self.core.on_replica_event(shard)
                elif channel_text in FENCE_EVENTS:
                    if channel_text == PROMOTION:
                        shard.note_promotion()
                    if not shard.fenced:
                        logger.info("shard %s: %s, holding writes", shard.label, channel_text)
                    shard.raise_fence(channel_text)
                elif shard.fenced:
                    logger.warning("shard %s: %s, releasing writes", shard.label, channel_text)
                    shard.lower_fence()
        except (ValueError, UnicodeDecodeError) as exc:
            logger.warning(
                "ignoring malformed %r message from sentinel %s: %r (%s)",
                channel,
                self.address,
                data,
                exc,
            )


class ListenerGroup:
    """The listeners of one core: one per known sentinel."""

    def __init__(self, core: ListenerCore, sentinel_kwargs: Mapping[str, Any]) -> None:
        self._core = core
        self._kwargs = dict(sentinel_kwargs)
        self._lock = threading.Lock()
        self._listeners: dict[Address, SentinelListener] = {}
        self._stopped = False
        self._resync = SharedResync(core)

    def __repr__(self) -> str:
        return f"<ListenerGroup {list(self._listeners.values())}>"

    def ensure(self, addresses: Sequence[Address]) -> None:
        """Start a listener for every sentinel that has none (learned sentinels included)."""
        started = []
        with self._lock:
            if self._stopped:
                return
            for address in addresses:
                if address not in self._listeners:
                    listener = SentinelListener(
                        self._core, address, self._kwargs, resync=self._resync
                    )
                    self._listeners[address] = listener
                    started.append(listener)
        for listener in started:
            listener.start()

    def stop(self, *, wait: bool = True) -> None:
        with self._lock:
            self._stopped = True
            listeners = list(self._listeners.values())
        for listener in listeners:
            listener.stop(wait=False)  # every socket closed first, then the joins
        if wait:
            for listener in listeners:
                listener.stop()

    def status(self) -> dict[str, bool]:
        return {str(a): listener.connected for a, listener in self._listeners.items()}

    def listeners(self) -> list[SentinelListener]:
        return list(self._listeners.values())
