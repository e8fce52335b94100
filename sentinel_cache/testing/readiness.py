"""The harness's own view of its processes: control connections, start-up readiness, and what the
sentinels say about a master (shared by :class:`LocalSentinelCluster` and the CLI)."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from sentinel_cache.testing.processes import (
    HOST,
    POLL_INTERVAL,
    Address,
    PortClashError,
    Proc,
    Runtime,
    log_tail,
)

_FAST_PING_PERIOD_MS = 50


# --------------------------------------------------------------------------- replies


def parse_pairs(reply: Any) -> dict[str, str]:
    """A RESP2 flat ``[k, v, k, v]`` reply (as SENTINEL MASTER returns it) as a dict."""
    items = list(reply)
    return {str(items[i]): str(items[i + 1]) for i in range(0, len(items) - 1, 2)}


def stringify(info: Any) -> dict[str, str]:
    """redis-py's parsed INFO dict with every value as str (it types them loosely)."""
    return {str(k): str(v) for k, v in dict(info).items()}


def as_address(address: Address | str) -> Address:
    if isinstance(address, str):
        host, _, port = address.rpartition(":")
        return host, int(port)
    return str(address[0]), int(address[1])


def control_client(host: str, port: int, password: str | None, **kwargs: Any) -> redis.Redis:
    """A polling client: RESP2, str replies, no retries, short timeouts."""
    return redis.Redis(
        host=host,
        port=port,
        password=password,
        **kwargs,
        protocol=2,
        decode_responses=True,
        socket_timeout=2.0,
        socket_connect_timeout=1.0,
        retry=Retry(NoBackoff(), 0),
        single_connection_client=True,
    )


# --------------------------------------------------------------------------- what sentinels say


def ask_sentinels(sentinels: Sequence[Callable[..., Any]], name: str) -> list[Address | None]:
    """Each sentinel's current answer for ``name`` (None where it did not answer).

    ``sentinels`` are callables running one command on one sentinel each.
    """
    answers: list[Address | None] = []
    for call in sentinels:
        try:
            reply = call("SENTINEL", "GET-MASTER-ADDR-BY-NAME", name)
        except (redis.RedisError, OSError):
            answers.append(None)
            continue
        answers.append((str(reply[0]), int(reply[1])) if reply else None)
    return answers


def wait_for_master_change(
    name: str,
    old: Address,
    ask: Callable[[], list[Address | None]],
    role: Callable[[Address], str | None],
    timeout: float,
) -> Address:
    """Wait until every answer of ``ask()`` names the same new master and it has ROLE master."""
    deadline = time.monotonic() + timeout
    last: list[Address | None] = []
    while True:
        last = ask()
        if last and all(a is not None and a != old for a in last) and len(set(last)) == 1:
            new = last[0]
            assert new is not None
            if role(new) == "master":
                return new
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"master of {name!r} did not move away from {old} within {timeout}s; "
                f"live sentinels report {last}"
            )
        time.sleep(POLL_INTERVAL)


# --------------------------------------------------------------------------- control links


class Links:
    """The harness's cached control connections to its own processes (one per port).

    They go to the real ports (``bind_host``), so a partition never cuts the harness off.
    """

    def __init__(
        self,
        runtime: Runtime,
        lock: threading.RLock,
        *,
        requirepass: str | None,
        sentinel_requirepass: str | None,
        tls_kwargs: dict[str, Any],
    ) -> None:
        self._runtime = runtime
        self._lock = lock
        self._requirepass = requirepass
        self._sentinel_requirepass = sentinel_requirepass
        self._tls_kwargs = tls_kwargs

    def client(self, proc: Proc) -> redis.Redis:
        """Cached internal client: RESP2, str replies, no retries, short timeouts (for polling)."""
        client = self._runtime.clients.get(proc.port)
        if client is None:
            password = self._sentinel_requirepass if proc.role == "sentinel" else self._requirepass
            client = control_client(proc.bind_host, proc.port, password, **self._tls_kwargs)
            self._runtime.clients[proc.port] = client
        return client

    def drop(self, port: int) -> None:
        with self._lock:
            client = self._runtime.clients.pop(port, None)
        if client is not None:
            with contextlib.suppress(Exception):
                client.close()

    def call(self, proc: Proc, *args: Any) -> Any:
        """Run a raw command on one of our processes; on a broken link, drop the cached client."""
        with self._lock:  # the cached clients are shared by every thread using this cluster
            try:
                return self.client(proc).execute_command(*args)
            except (redis.ConnectionError, redis.TimeoutError, OSError):
                self.drop(proc.port)
                raise

    def verify_owner(self, proc: Proc) -> None:
        """Make sure the process answering on the port is ours, not another test's server."""
        if proc.popen is None or proc.verified_pid == proc.popen.pid:
            return
        info = stringify(self.call(proc, "INFO", "server"))
        pid = int(info.get("process_id", "0"))
        if pid != proc.popen.pid:
            raise PortClashError(
                f"{HOST}:{proc.port} is answered by pid {pid}, not ours", proc.port
            )
        proc.verified_pid = pid


# --------------------------------------------------------------------------- start-up


class Readiness:
    """Brings a freshly spawned topology up wave by wave and says when it is fully formed."""

    def __init__(
        self,
        links: Links,
        runtime: Runtime,
        *,
        master_names: Sequence[str],
        replicas: int,
        sentinels: int,
        start_timeout: float,
        server: str,
    ) -> None:
        self._links = links
        self._runtime = runtime
        self._master_names = master_names
        self._replicas = replicas
        self._sentinels = sentinels
        self._start_timeout = start_timeout
        self._server = server  # "kind version", for error messages

    def _nodes(self) -> list[Proc]:
        return [p for p in self._runtime.procs if p.role == "node"]

    def masters_at_start(self) -> list[Proc]:
        return [p for p in self._nodes() if p.index % (1 + self._replicas) == 0]

    def check_exited(self) -> None:
        for proc in self._runtime.procs:
            if proc.popen is not None and proc.popen.poll() is not None:
                log = log_tail(proc.log_path)
                if "Address already in use" in log:
                    raise PortClashError(f"{proc.describe()}: port taken", proc.port)
                raise RuntimeError(f"{proc.describe()} exited during start-up; log tail:\n{log}")

    def node_ready(self, proc: Proc) -> str | None:
        """None when the node is ours and (for replicas) linked to its master, else why not."""
        try:
            self._links.verify_owner(proc)
            if proc.index % (1 + self._replicas) == 0:
                return None
            info = stringify(self._links.call(proc, "INFO", "replication"))
        except (redis.RedisError, OSError) as exc:
            return f"not answering ({exc})"
        if info.get("master_link_status") != "up":
            return f"master_link_status={info.get('master_link_status')}"
        master = self._nodes()[proc.shard * (1 + self._replicas)]
        return self.streaming_pending(master, self._replicas)

    def streaming_pending(self, master: Proc, replicas: int) -> str | None:
        """None once ``replicas`` replicas acknowledge a fresh write on ``master``.

        ``master_link_status:up`` is not enough: after a diskless full sync the master streams
        writes only after the replica's first REPLCONF ACK, and when that ACK races the end of
        the RDB child it is ignored, so writes sit in the master's buffer for up to a second
        (the replica's next ACK). A failover in that window loses them. A PUBLISH is replicated
        without touching the keyspace, and WAIT tells when the replicas have processed it.
        """
        if replicas == 0:
            return None
        try:
            self._links.call(master, "PUBLISH", "__sentinel_cache__:replication-check", "1")
            acked = int(self._links.call(master, "WAIT", replicas, 20))
        except (redis.RedisError, OSError) as exc:
            return f"master {master.port}: {exc}"
        if acked < replicas:
            return f"master {master.port} streams to {acked} of {replicas} replicas"
        return None

    def speed_up_links(self, proc: Proc) -> None:
        """Retry failed links every 50 ms instead of every second while the topology forms.

        A sentinel tries its peers ~1 ms after it starts; a peer that is not listening yet is
        retried only after PING-PERIOD (1 s), which dominated start-up. ``SENTINEL DEBUG`` (Redis
        7.0+, Valkey) shortens it; :meth:`restore_links` puts the default back once ready.
        """
        if proc.saved_ping_period is not None:
            return
        try:
            current = self._links.call(proc, "SENTINEL", "DEBUG")
            values = {
                str(current[i]).lower(): str(current[i + 1]) for i in range(0, len(current) - 1, 2)
            }
            self._links.call(proc, "SENTINEL", "DEBUG", "ping-period", _FAST_PING_PERIOD_MS)
        except redis.ResponseError:
            proc.saved_ping_period = ""  # no SENTINEL DEBUG here: start-up is just slower
            return
        proc.saved_ping_period = values.get("ping-period", "1000")

    def restore_links(self) -> None:
        for proc in self._runtime.procs:
            if proc.role != "sentinel":
                continue
            if proc.saved_ping_period:
                self._links.call(proc, "SENTINEL", "DEBUG", "ping-period", proc.saved_ping_period)
            proc.saved_ping_period = None

    def sentinel_ready(self, proc: Proc) -> str | None:
        """None when this sentinel sees every master with all replicas and other sentinels."""
        call = self._links.call
        try:
            self._links.verify_owner(proc)
            self.speed_up_links(proc)
            for name in self._master_names:
                master = parse_pairs(call(proc, "SENTINEL", "MASTER", name))
                flags = master.get("flags", "")
                if flags != "master":
                    return f"{name}: flags={flags}"
                others = int(master.get("num-other-sentinels", -1))
                if others != self._sentinels - 1:
                    return f"{name}: num-other-sentinels={others}"
                if int(master.get("num-slaves", -1)) != self._replicas:
                    return f"{name}: num-slaves={master.get('num-slaves')}"
                for replica in call(proc, "SENTINEL", "REPLICAS", name):
                    state = parse_pairs(replica)
                    if state.get("flags") != "slave" or state.get("master-link-status") != "ok":
                        return (
                            f"{name}: replica {state.get('name')} flags={state.get('flags')} "
                            f"link={state.get('master-link-status')}"
                        )
                for other in call(proc, "SENTINEL", "SENTINELS", name):
                    state = parse_pairs(other)
                    if state.get("flags") != "sentinel":
                        return f"{name}: sentinel {state.get('name')} flags={state.get('flags')}"
        except (redis.RedisError, OSError) as exc:
            return f"not answering ({exc})"
        return None

    def wait_ready(self, deadline: float) -> None:
        masters = self.masters_at_start()
        self.wait_for(masters, deadline)
        # Sentinels start once replicas are linked: a sentinel that first sees a replica with
        # master_link_status:down re-reads its INFO only a second later.
        for group in (
            [p for p in self._nodes() if p not in masters],
            [p for p in self._runtime.procs if p.role == "sentinel"],
        ):
            for proc in group:
                proc.spawn()
            self.wait_for(group, deadline)
        self.restore_links()
        self.check_exited()

    def wait_for(self, procs: list[Proc], deadline: float) -> None:
        """Poll until every process in ``procs`` is ready, or raise with the laggard's log."""
        pending: dict[int, str] = {}
        waiting = list(procs)
        while waiting:
            self.check_exited()
            still: list[Proc] = []
            for proc in waiting:
                why = self.node_ready(proc) if proc.role == "node" else self.sentinel_ready(proc)
                if why is not None:
                    pending[proc.port] = why
                    still.append(proc)
            waiting = still
            if not waiting:
                return
            if time.monotonic() > deadline:
                worst = waiting[0]
                raise RuntimeError(
                    f"LocalSentinelCluster did not become ready within {self._start_timeout:.0f}s "
                    f"({self._server}); {worst.describe()}: "
                    f"{pending.get(worst.port)}; log tail:\n{log_tail(worst.log_path)}"
                )
            time.sleep(POLL_INTERVAL)
