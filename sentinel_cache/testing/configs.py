"""What each process is started with: a data node's command line, a sentinel's config file."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sentinel_cache.testing.processes import HOST
from sentinel_cache.testing.tls import TLSFiles


@dataclass(frozen=True)
class Configs:
    """The settings of one start of a topology, and the arguments and files they make."""

    server_binary: str
    master_names: Sequence[str]
    replicas: int
    quorum: int
    down_after_ms: int
    failover_timeout_ms: int
    requirepass: str | None = None
    sentinel_requirepass: str | None = None
    extra_server_args: Sequence[str] = ()
    tls: TLSFiles | None = None

    def node_argv(self, port: int, node_dir: str, bind_host: str = HOST) -> list[str]:
        if self.tls is None:
            listen = ["--port", str(port)]
        else:  # TLS only: no plain-text port at all
            listen = ["--port", "0", "--tls-port", str(port), *self.tls.server_args()]
        argv = [
            self.server_binary,
            *listen,
            "--bind", bind_host,
            "--dir", node_dir,
            "--save", "",
            "--appendonly", "no",
            "--daemonize", "no",
            "--protected-mode", "no",
            "--logfile", "",
            # Full syncs go through a (tiny) RDB file: a diskless sync starts streaming writes
            # only after the replica's first ACK, which often races the RDB child's exit and is
            # then ignored, leaving writes unreplicated for up to a second (and it waits 5 s
            # for more replicas by default).
            "--repl-diskless-sync", "no",
            # Load the master's RDB straight from the socket: Valkey 9's disk-based load notices
            # the finished download only on its next once-a-second cron.
            "--repl-diskless-load", "swapdb",
            # Redis 7 makes a SIGTERM-ed master wait up to 10 s for lagging replicas.
            "--shutdown-timeout", "0",
        ]  # fmt: skip
        if self.requirepass is not None:
            argv += ["--requirepass", self.requirepass, "--masterauth", self.requirepass]
        if bind_host != HOST:  # faults: connect out from our own IP, be known by the proxy's
            argv += ["--bind-source-addr", bind_host, "--replica-announce-ip", HOST]
        return argv + list(self.extra_server_args)

    def sentinel_conf(
        self,
        index: int,
        port: int,
        sentinel_ports: list[int],
        ids: list[str],
        node_ports: list[int],
        workdir: str,
        bind_host: str = HOST,
    ) -> str:
        """Sentinel config; known-replica/known-sentinel lines skip the slow discovery rounds.

        Without them a sentinel learns replicas from the master's INFO (every 10 s) and other
        sentinels from hello messages (every 2 s); with them the topology is known at boot.
        """
        if self.tls is None:
            listen = [f"port {port}"]
        else:  # TLS to clients, and (tls-replication) to the nodes and the other sentinels
            args = self.tls.server_args()
            listen = ["port 0", f"tls-port {port}"] + [
                f"{args[i][2:]} {args[i + 1]}" for i in range(0, len(args), 2)
            ]
        lines = [
            *listen,
            f"bind {bind_host}",
            f"dir {workdir}",
            "daemonize no",
            'logfile ""',
            f"sentinel myid {ids[index]}",
        ]
        if bind_host != HOST:  # faults: connect out from our own IP, be known by the proxy's
            lines += [f"bind-source-addr {bind_host}", f"sentinel announce-ip {HOST}"]
        if self.sentinel_requirepass is not None:
            lines.append(f"requirepass {self.sentinel_requirepass}")
            lines.append(f"sentinel sentinel-pass {self.sentinel_requirepass}")
        per_shard = 1 + self.replicas
        for shard, name in enumerate(self.master_names):
            master_port = node_ports[shard * per_shard]
            lines += [
                f"sentinel monitor {name} {HOST} {master_port} {self.quorum}",
                f"sentinel down-after-milliseconds {name} {self.down_after_ms}",
                f"sentinel failover-timeout {name} {self.failover_timeout_ms}",
                f"sentinel parallel-syncs {name} 1",
            ]
            if self.requirepass is not None:
                lines.append(f"sentinel auth-pass {name} {self.requirepass}")
            for i in range(1, per_shard):
                lines.append(
                    f"sentinel known-replica {name} {HOST} {node_ports[shard * per_shard + i]}"
                )
            for other, other_port in enumerate(sentinel_ports):
                if other != index:
                    lines.append(f"sentinel known-sentinel {name} {HOST} {other_port} {ids[other]}")
        return "\n".join(lines) + "\n"
