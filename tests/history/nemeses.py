"""Nemeses: faults struck during a recorded run, each recorded in the history as an
:class:`~history.recorder.Event` (name, start, end, detail).

A nemesis is a callable ``strike(ctx) -> detail`` that does its fault and returns once it is
over (healed, or the failover it caused is done; settling is the runner's job). To add one:
write the function and add it to :data:`NEMESES`. :class:`AtStep` makes any nemesis land inside
a feature's multi-step work: it waits until a client reaches a :class:`~history.recorder.StepHook`
(the client pauses there), strikes, then lets the client go on.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import redis

from sentinel_cache.testing import LocalSentinelCluster

from .recorder import Event, Recorder


@dataclass
class Context:
    """What a nemesis gets: the topology, the shard it targets, and the running recorder (for
    step hooks)."""

    cluster: LocalSentinelCluster
    target: str  # a master name
    recorder: Recorder | None = None
    events: list[Event] = field(default_factory=list)

    def __repr__(self) -> str:
        return f"<nemesis Context {self.target} {len(self.events)} events>"


Strike = Callable[[Context], str]


def run(name: str, strike: Strike, ctx: Context) -> Event:
    """Strike and record the event."""
    start = time.monotonic()
    detail = strike(ctx)
    event = Event(name, start, time.monotonic(), detail)
    ctx.events.append(event)
    return event


def _addr(address: tuple[str, int]) -> str:
    return f"{address[0]}:{address[1]}"


#: How long a planned failover may take before it is asked for again, and how many times.
FAILOVER_PATIENCE, FAILOVER_ASKS = 12.0, 3


#: An attempt the sentinels accepted and then gave up on (``FAILOVER_ABORTED`` events): its
#: writes were held on the fence for ``FAILOVER_HOLD`` and then failed, as the docs say
#: (FailoverInProgressError), since no new master came; the checker excuses those.
FAILOVER_ABORTED = "failover aborted by the sentinels"


def planned_failover(ctx: Context) -> str:
    """SENTINEL FAILOVER; over when every sentinel names the new master. The sentinels may
    accept the command and then abort it (no replica good enough yet by their last INFO, taken
    every 10 s: a make test at load 8 saw a failover right after another one never happen, and
    a CI run one whose promotion was not confirmed in time): the fault is then asked for again,
    the detail says so, and the aborted attempt is recorded (``FAILOVER_ABORTED``). The cache
    is not what is tried here; the nemesis must happen."""
    old = ctx.cluster.master_address(ctx.target)
    for ask in range(1, FAILOVER_ASKS + 1):
        began = time.monotonic()
        try:
            ctx.cluster.failover(ctx.target)
        except redis.ResponseError as exc:  # INPROG: the last ask's failover is still going
            if "INPROG" not in str(exc):
                raise
        try:
            new = ctx.cluster.wait_for_master_change(ctx.target, old, timeout=FAILOVER_PATIENCE)
        except TimeoutError:
            if ask == FAILOVER_ASKS:
                raise
            ctx.events.append(Event(FAILOVER_ABORTED, began, time.monotonic(), ctx.target))
            continue
        asked = "" if ask == 1 else f" (asked {ask} times: the sentinels aborted the first)"
        return f"{ctx.target}: {_addr(old)} -> {_addr(new)}{asked}"
    raise AssertionError("unreachable")  # the last ask raised or returned


def kill_master(ctx: Context) -> str:
    """SIGKILL of the master; over once the sentinels promoted a replica and the old node is
    back as a replica (a crashed server restarted)."""
    old = ctx.cluster.kill_master(ctx.target)
    new = ctx.cluster.wait_for_master_change(ctx.target, old, timeout=30)
    ctx.cluster.restart_node(old, as_replica=True)
    return f"{ctx.target}: killed {_addr(old)}, promoted {_addr(new)}, old restarted as replica"


def partition_healed_at_switch(ctx: Context) -> str:
    """The master cut from everyone (fault proxy) until the sentinels switched, healed 0.1 s
    later: the writes its clients sent during the cut arrive at a master about to be demoted."""
    old = ctx.cluster.master_address(ctx.target)
    ctx.cluster.partition(ctx.target)
    try:
        new = ctx.cluster.wait_for_master_change(ctx.target, old, timeout=30)
        time.sleep(0.1)
    finally:
        ctx.cluster.heal(ctx.target)
    return f"{ctx.target}: {_addr(old)} cut, switched to {_addr(new)}, healed"


#: the event of one CLIENT KILL within the "client kill" nemesis: from sending it to its reply
KILL_SENT = "client kill sent"


def relayed(cluster: LocalSentinelCluster, address: tuple[str, int]) -> float:
    """When every client connection the node closed before this call has been closed on the
    clients' side too: at once without the fault proxy; through it, once a new proxied
    connection has had a PING answered.

    Why: the kill is sent past the proxy (``direct``, as the sentinels reach the node) and its
    reply comes back that way, while each client's end of file must be read and relayed by the
    proxy first: up to 1.9 ms later on an idle machine, several under load
    (tests/test_kill_storm.py). The proxy reads every upstream end of file that arrived before
    the reply in the loop turn that accepts the new connection, and relays each at once (no
    shaping during a kill); the PONG needs later turns, so it arrives after all of them."""
    with cluster.node_client(address, socket_timeout=5) as probe:
        probe.ping()
    return time.monotonic()


def client_kill(ctx: Context, times: int = 3, every: float = 0.3) -> str:
    """``CLIENT KILL TYPE normal`` on the master, as the sentinels send it on a
    reconfiguration: every client connection closed under the clients."""
    address = ctx.cluster.master_address(ctx.target)
    killed = 0
    node = ctx.cluster.node_client(address, direct=True, socket_timeout=5)
    try:
        for n in range(times):
            sent = time.monotonic()
            killed += int(node.execute_command("CLIENT", "KILL", "TYPE", "normal"))
            # each kill's own instant (the checker's unavailable rule excuses only the ops
            # in flight across one), ended when the proxy has relayed it to the clients
            ctx.events.append(Event(KILL_SENT, sent, relayed(ctx.cluster, address), ctx.target))
            if n + 1 < times:
                time.sleep(every)
    finally:
        node.close()
    return f"{ctx.target} {_addr(address)}: {killed} connections killed in {times} kills"


def frozen_master(ctx: Context, seconds: float = 0.5) -> str:
    """SIGSTOP of the master for ``seconds`` (under down-after: no failover), then SIGCONT."""
    address = ctx.cluster.master_address(ctx.target)
    ctx.cluster.freeze_node(address)
    try:
        time.sleep(seconds)
    finally:
        ctx.cluster.thaw_node(address)
    return f"{ctx.target} {_addr(address)} frozen {seconds}s"


def replica_cut(ctx: Context, seconds: float = 2.0) -> str:
    """A replica cut from its master's stream (fault proxy, both ways) for ``seconds``; it
    still answers clients and sentinels, and falls behind."""
    master = ctx.cluster.master_address(ctx.target)
    replica = ctx.cluster.replica_addresses(ctx.target)[0]
    ctx.cluster.partition(replica, peers=[master])
    try:
        time.sleep(seconds)
    finally:
        ctx.cluster.heal(replica)
    return f"{ctx.target}: replica {_addr(replica)} cut from {_addr(master)} for {seconds}s"


def stale_replica_outage(ctx: Context, behind: float = 3.0, outage: float = 2.0) -> str:
    """Issue 36, finding 12: a replica's stream silently cut (its link still reads "up") while
    the master goes on taking writes for ``behind`` seconds, then the master cut from the
    clients only (no failover: the sentinels still see it) for ``outage`` seconds, so that
    OUTAGE_READS sends the clients' reads to the replica that fell behind."""
    master = ctx.cluster.master_address(ctx.target)
    replica = ctx.cluster.replica_addresses(ctx.target)[0]
    ctx.cluster.partition(replica, peers=[master])
    try:
        time.sleep(behind)
        ctx.cluster.partition(ctx.target, peers=["client"])
        time.sleep(outage)
    finally:
        ctx.cluster.heal()
    return (
        f"{ctx.target}: replica {_addr(replica)} cut from {_addr(master)}, "
        f"{behind}s later the master cut from the clients for {outage}s"
    )


@dataclass(frozen=True)
class AtStep:
    """Strike ``strike`` when a client reaches the step hook ``step`` (armed in the plan's
    ``hooks``); the client waits there until the strike is over. Gives up (and says so in the
    detail) if no client reaches the step within ``wait`` seconds."""

    step: str
    strike: Strike
    wait: float = 20.0

    def __call__(self, ctx: Context) -> str:
        assert ctx.recorder is not None, "AtStep needs the running recorder"
        reached, released = ctx.recorder.step(self.step)
        if not reached.wait(self.wait):
            return f"step {self.step} not reached within {self.wait}s: nothing struck"
        try:
            return f"at step {self.step}: " + self.strike(ctx)
        finally:
            released.set()


NEMESES: dict[str, Strike] = {
    "none": lambda ctx: "no fault",
    "planned failover": planned_failover,
    "kill master": kill_master,
    "partition healed at switch": partition_healed_at_switch,
    "client kill": client_kill,
    "frozen master": frozen_master,
    "replica cut": replica_cut,
    "stale replica, then outage": stale_replica_outage,
}


def describe(ctx: Context) -> dict[str, Any]:
    """The target's current master and replicas (for a report)."""
    return {
        "master": ctx.cluster.master_address(ctx.target),
        "replicas": ctx.cluster.replica_addresses(ctx.target),
    }
