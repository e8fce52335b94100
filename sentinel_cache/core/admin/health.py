"""Health probes for load balancers and orchestrators: can every shard serve right now?

:func:`check` writes and reads back a probe key on every shard's current master, all shards at
once, within a short time budget, and tells two things apart:

* **ready** (can serve): every shard's master took the write and returned it. A shard that did
  not is named, with its master and the error, in ``problems``; the report's status is
  ``"down"``.
* **degraded** (redundancy reduced): every shard serves, but something that protects it is
  missing: a master with no replica online (a failover is impossible: after a planned failover
  too, until the old master has become a replica), a failover listener not connected to its
  sentinel, writes held by a failover in progress, sentinels that could not be asked, a near
  cache that is on but not tracking (for a moment after a switch, or for good), a master
  that restarted without a failover in the last ``RESTART_WARNING_SECONDS`` (its data is lost
  unless it persists it). Listed in ``warnings``; status ``"degraded"``.

A readiness probe should fail only when the cache cannot serve (``fail_on="down"``, the
default of :func:`http_status`), so that it does not flap through a planned failover; an alert
may also fire on ``"degraded"``.

The probe key of a shard is ``sentinel_cache:health:<master name>:<n>``, the first ``n`` the
ring places on that shard (found once per core). It is written with a unique token and a
10-second expiry (``PX``), read back and the master asked ``ROLE`` (which counts its online
replicas), in one round trip, on a connection of the probe's own with the budget as its socket
timeout: the pool's connections serve traffic and have the (longer) ``SOCKET_TIMEOUT``, and the
cache operations' safety net could retry past the budget. What the safety net does first is done
here too: a master that fails the probe makes the shard ask the sentinels again (rate-limited,
as for any cache call), so a probe can move a shard to its new master; if it moved and time is
left, the probe is tried once more there.

Nothing here can hang: every shard is probed on a thread of its own and the report is made when
the budget is spent, a shard still unanswered reported as failed. :func:`check` never raises for
a dead topology. ``deep=True`` adds the sentinels' view (:func:`sentinel_cache.core.admin.status.collect`:
every sentinel asked about every master, replicas, quorum), which takes up to about four budgets.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import threading
import time
import uuid
import weakref
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

import redis

from sentinel_cache.core.admin import states
from sentinel_cache.core.admin import status as status_module
from sentinel_cache.core.admin.states import (
    DEGRADED,
    DOWN,
    FAIL_ON,
    HEALTH_FAIL_ON,
    HEALTH_TIMEOUT,
    HEALTHY,
    describe,
)
from sentinel_cache.core.config import Address, connection_class_and_kwargs
from sentinel_cache.core.fanout import Fanout, run_all
from sentinel_cache.core.topology.discovery import redact, reply_text, secret_values
from sentinel_cache.exceptions import AuthenticationFailedError, ProbeFailed

if TYPE_CHECKING:
    from sentinel_cache.core.topology.shard import Shard
    from sentinel_cache.core.topology.sharded_pool import ShardedSentinelPool

__all__ = [
    "DEFAULT_TIMEOUT",
    "DEGRADED",
    "DOWN",
    "FAIL_ON",
    "HEALTHY",
    "OK",
    "PROBE_PREFIX",
    "PROBE_TTL_MS",
    "HealthReport",
    "ShardHealth",
    "budget_for",
    "check",
    "check_all",
    "http_status",
    "parse_fail_on",
    "parse_flag",
    "probe_key",
    "state_of",
    "status_word",
    "summary",
]

#: The default budget in seconds (or the pool's ``SOCKET_TIMEOUT``, if that is shorter).
DEFAULT_TIMEOUT = HEALTH_TIMEOUT
#: The probe keys' expiry: a probe leaves nothing behind for long.
PROBE_TTL_MS = 10_000
PROBE_PREFIX = "sentinel_cache:health:"
_TOKEN_PREFIX = "sentinel_cache-probe:"
_KEY_SEARCH_LIMIT = 1_000_000
_MAX_PROBE_CONNECTIONS = 8  # per master and budget; probes of a hung node end by their timeouts

#: A master's restart without a failover (data lost) keeps the health degraded this long.
RESTART_WARNING_SECONDS = 300.0

#: The report's ``status`` word for :data:`~sentinel_cache.core.admin.states.HEALTHY`: the
#: endpoints said ``"ok"`` before the tools shared one vocabulary, and monitors match it. The
#: report's ``state`` says ``"healthy"``, as the status report does.
OK = "ok"


def status_word(state: str) -> str:
    """The ``status`` field's word for a state (``"ok"`` for healthy, else the state)."""
    return OK if state == HEALTHY else state


def state_of(status: str) -> str:
    """The state a ``status`` word (or a state) stands for."""
    return HEALTHY if status == OK else status


@dataclass(frozen=True)
class ShardHealth:
    """One shard's probe: ``ok`` if its master took the write and returned it."""

    index: int
    name: str
    ok: bool
    #: The master probed (the last one tried), None if no master is known.
    address: str | None
    latency_ms: float | None
    #: Why the probe failed, naming the shard and its master; None when ok.
    error: str | None
    key: str
    #: Replicas the master reports online (``ROLE``); None if it could not be asked.
    replicas_online: int | None = None
    fenced: bool = False
    #: What reduces this shard's redundancy (also in the report's ``warnings``).
    warnings: tuple[str, ...] = ()

    @property
    def label(self) -> str:
        return f"{self.index} ({self.name})"


@dataclass(frozen=True)
class HealthReport:
    """What :func:`check` found; :meth:`as_dict` is the JSON the health endpoints serve."""

    #: ``"ok"``, ``"degraded"`` (serving, redundancy reduced) or ``"down"`` (a shard cannot serve).
    status: str
    #: Every shard took the write and returned it: the cache can serve.
    ready: bool
    #: Serving with reduced redundancy (see ``warnings``); False when down.
    degraded: bool
    shards: tuple[ShardHealth, ...]
    #: One line per failing shard, naming it (empty when ready).
    problems: tuple[str, ...]
    #: What reduces redundancy, one line each.
    warnings: tuple[str, ...]
    timeout: float
    elapsed_ms: float
    checked_at: str
    #: Per sentinel address: is this process's failover listener connected (None: no listener).
    listeners: Mapping[str, bool | None] = field(default_factory=dict)
    #: The sentinels' view (:func:`sentinel_cache.core.admin.status.collect`) when asked ``deep=True``.
    deep: Mapping[str, Any] | None = None

    @property
    def state(self) -> str:
        """``healthy``, ``degraded`` or ``down``: the words of the status report."""
        return state_of(self.status)

    @property
    def failing(self) -> list[str]:
        """The labels (``"1 (shard_b)"``) of the shards that failed the probe."""
        return [shard.label for shard in self.shards if not shard.ok]

    def as_dict(self) -> dict[str, Any]:
        """Plain JSON-able data (``json.dumps`` takes it as it is)."""
        data = {"state": self.state, **dataclasses.asdict(self)}
        data["problems"] = list(self.problems)
        data["warnings"] = list(self.warnings)
        data["shards"] = [
            {**shard, "warnings": list(shard["warnings"])} for shard in data["shards"]
        ]
        data["listeners"] = dict(self.listeners)
        if self.deep is None:
            del data["deep"]
        return data


# -- probe keys and connections, kept per core -------------------------------------------------


def probe_key(core: ShardedSentinelPool, index: int) -> str:
    """The first ``sentinel_cache:health:<name>:<n>`` the ring places on shard ``index``."""
    shard = core.shards[index]
    for n in range(_KEY_SEARCH_LIMIT):
        key = f"{PROBE_PREFIX}{shard.name}:{n}"
        if core.shard_index(key) == index:
            return key
    raise RuntimeError(f"no probe key for shard {shard.label} in {_KEY_SEARCH_LIMIT} tries")


class _Prober:
    """A core's probe keys and the probes' own connections (per master and budget)."""

    def __init__(self, core: ShardedSentinelPool) -> None:
        self.pid = os.getpid()
        self.keys = tuple(probe_key(core, shard.index) for shard in core.shards)
        self.secrets = secret_values(core.config.connection_options())
        self._options = core.config.connection_options()
        self._lock = threading.Lock()
        self._clients: dict[tuple[Address, float], redis.Redis] = {}

    def client(self, address: Address, timeout: float) -> redis.Redis:
        with self._lock:
            client = self._clients.get((address, timeout))
            if client is None:
                connection_class, options = connection_class_and_kwargs(
                    {
                        **self._options,
                        "socket_timeout": timeout,
                        "socket_connect_timeout": timeout,
                    }
                )
                # An explicit pool: none of redis-py's client-level retries and backoff.
                pool = redis.ConnectionPool(
                    host=address.host,
                    port=address.port,
                    connection_class=connection_class,
                    max_connections=_MAX_PROBE_CONNECTIONS,
                    **options,
                )
                client = self._clients[address, timeout] = redis.Redis(connection_pool=pool)
            return client

    def keep_only(self, addresses: Iterable[Address | None]) -> None:
        """Close the connections to nodes that are no shard's master any more."""
        current = set(addresses)
        with self._lock:
            gone = [k for k in self._clients if k[0] not in current]
            dropped = [self._clients.pop(k) for k in gone]
        for client in dropped:
            client.connection_pool.disconnect()

    def close(self) -> None:
        self.keep_only(())


_probers: weakref.WeakKeyDictionary[ShardedSentinelPool, _Prober] = weakref.WeakKeyDictionary()
_probers_lock = threading.Lock()


def _reinit_after_fork() -> None:
    global _probers_lock
    _probers_lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reinit_after_fork)


def _prober(core: ShardedSentinelPool) -> _Prober:
    with _probers_lock:
        prober = _probers.get(core)
        if prober is None or prober.pid != os.getpid():
            prober = _probers[core] = _Prober(core)
            core.on_close(prober.close)
        return prober


# -- the probe ---------------------------------------------------------------------------------


def _online_replicas(role: Any) -> int | None:
    """How many replicas a master's ``ROLE`` reply lists (only online ones are listed)."""
    if isinstance(role, BaseException) or not isinstance(role, (list, tuple)) or len(role) < 3:
        return None
    if reply_text(role[0]) != "master" or not isinstance(role[2], (list, tuple)):
        return None
    return len(role[2])


def _round_trip(client: redis.Redis, key: str) -> tuple[float, int | None]:
    """SET the key with a new token, GET it back and ask ROLE, in one round trip; returns the
    latency (ms) and the online replicas. Raises if the master did not work as one."""
    token = f"{_TOKEN_PREFIX}{uuid.uuid4().hex}"
    pipe = client.pipeline(transaction=False)
    pipe.set(key, token, px=PROBE_TTL_MS)
    pipe.get(key)
    pipe.execute_command("ROLE")
    started = time.perf_counter()
    stored, read, role = pipe.execute(raise_on_error=False)
    latency = round((time.perf_counter() - started) * 1000, 2)
    for reply in (stored, read):
        if isinstance(reply, BaseException):
            raise reply
    if not stored:
        raise ProbeFailed("the probe write was not acknowledged")
    text = None if read is None else reply_text(read)
    # Another process's probe may have written in between: its token proves reads work too.
    if text is None or not text.startswith(_TOKEN_PREFIX):
        raise ProbeFailed(f"the probe key read back {text!r:.60} instead of the token written")
    return latency, _online_replicas(role)


def _probe_shard(
    core: ShardedSentinelPool, prober: _Prober, shard: Shard, timeout: float, deadline: float
) -> ShardHealth:
    key = prober.keys[shard.index]

    def failed(address: Address | None, why: str) -> ShardHealth:
        if not why.startswith(f"shard {shard.label}"):  # the core's errors name it already
            where = "" if address is None else f"master {address}: "
            why = f"shard {shard.label}: {where}{why}"
        error = redact(why, prober.secrets)
        return ShardHealth(
            shard.index,
            shard.name,
            False,
            None if address is None else str(address),
            None,
            error,
            key,
            fenced=shard.fenced,
        )

    def succeeded(address: Address, latency: float, replicas: int | None) -> ShardHealth:
        return ShardHealth(
            shard.index, shard.name, True, str(address), latency, None, key, replicas, shard.fenced
        )

    try:
        core.ready(shard, False)  # starts the core; asks the sentinels for a shard with no master
    except Exception as exc:
        return failed(shard.address, str(exc) if str(exc).startswith("shard ") else describe(exc))
    address, generation = shard.current()
    if address is None:
        return failed(None, f"no master known ({shard.error})")
    try:
        return succeeded(address, *_round_trip(prober.client(address, timeout), key))
    except (redis.RedisError, OSError) as exc:
        error: BaseException = exc
    # The safety net's first step, as a cache call on this shard would take it.
    try:
        if core.should_reresolve(shard, error, generation):
            core.reresolve(shard, reason=f"health probe: {describe(error)}", suspect=address)
    except AuthenticationFailedError as refused:
        return failed(address, str(refused))
    except (redis.RedisError, OSError):
        pass  # the sentinels' trouble is reported by the warnings, the probe's by the error
    moved, now = shard.current()
    if now != generation and moved is not None and time.monotonic() < deadline:
        try:
            return succeeded(moved, *_round_trip(prober.client(moved, timeout), key))
        except (redis.RedisError, OSError) as exc:
            return failed(moved, describe(exc))
    return failed(address, describe(error))


def budget_for(core: ShardedSentinelPool, timeout: float | None = None) -> float:
    """``timeout``, or by default :data:`DEFAULT_TIMEOUT` or the pool's ``SOCKET_TIMEOUT``,
    whichever is shorter."""
    if timeout is not None:
        if not timeout > 0:
            raise ValueError(f"timeout must be a positive number of seconds (got {timeout!r})")
        return float(timeout)
    socket_timeout = core.config.connection_options().get("socket_timeout")
    if isinstance(socket_timeout, (int, float)) and 0 < socket_timeout < DEFAULT_TIMEOUT:
        return float(socket_timeout)
    return DEFAULT_TIMEOUT


def check(
    core: ShardedSentinelPool, *, timeout: float | None = None, deep: bool = False
) -> HealthReport:
    """Probe every shard of ``core`` at once; returns within about ``timeout`` seconds (four
    of them with ``deep``), whatever the state of the topology. See the module docstring.

    ``timeout`` defaults to :data:`DEFAULT_TIMEOUT` (0.5 s) or the pool's ``SOCKET_TIMEOUT``,
    whichever is shorter; it bounds the whole check and every socket operation of the probes.
    The first check in a process starts the core (discovery) if nothing else has.
    """
    budget = budget_for(core, timeout)
    began = time.monotonic()
    deadline = began + budget
    collected = (
        Fanout(
            {"deep": lambda: status_module.collect(core, timeout=budget, fail_on=DOWN)},
            name="sentinel_cache-health-deep",
        )
        if deep
        else None
    )
    prober = _prober(core)
    tasks = {
        shard.index: functools.partial(_probe_shard, core, prober, shard, budget, deadline)
        for shard in core.shards
    }
    outcomes = run_all(tasks, deadline, "health")
    shards = tuple(
        _outcome(core.shards[index], prober, outcome, budget)
        for index, outcome in sorted(outcomes.items())
    )
    prober.keep_only(shard.address for shard in core.shards)
    deep_report: dict[str, Any] | None = None
    if collected is not None:
        deep_report = _deep_report(collected, began + 4 * budget + 0.2)
    snapshot = core.status()
    listeners = {s["address"]: s["listener_connected"] for s in snapshot["sentinels"]}
    shards = tuple(_with_warnings(shard, core, snapshot) for shard in shards)
    warnings = [w for shard in shards for w in shard.warnings]
    warnings += [
        f"sentinel {address}: the failover listener is not connected (failovers are learnt "
        "only when a call fails)"
        for address, connected in listeners.items()
        if connected is False
    ]
    if deep_report is not None:
        warnings += [f"sentinels: {message}" for message in _deep_messages(deep_report)]
    problems = tuple(shard.error or "" for shard in shards if not shard.ok)
    ready = not problems
    degraded = ready and bool(warnings)
    return HealthReport(
        status=status_word(DOWN if not ready else DEGRADED if degraded else HEALTHY),
        ready=ready,
        degraded=degraded,
        shards=shards,
        problems=problems,
        warnings=tuple(dict.fromkeys(warnings)),
        timeout=budget,
        elapsed_ms=round((time.monotonic() - began) * 1000, 2),
        checked_at=datetime.now(timezone.utc).isoformat(timespec="milliseconds"),
        listeners=listeners,
        deep=deep_report,
    )


def _outcome(
    shard: Shard, prober: _Prober, outcome: ShardHealth | BaseException, budget: float
) -> ShardHealth:
    if isinstance(outcome, ShardHealth):
        return outcome
    address = shard.address
    where = "" if address is None else f"master {address}: "
    why = (
        f"no answer within {budget:g}s"
        if isinstance(outcome, TimeoutError)
        else f"probe failed: {describe(outcome)}"
    )
    return ShardHealth(
        shard.index,
        shard.name,
        False,
        None if address is None else str(address),
        None,
        redact(f"shard {shard.label}: {where}{why}", prober.secrets),
        prober.keys[shard.index],
        fenced=shard.fenced,
    )


def _with_warnings(
    shard: ShardHealth, core: ShardedSentinelPool, snapshot: Mapping[str, Any]
) -> ShardHealth:
    """The shard's redundancy warnings: from the probe (ROLE) and the core's memory."""
    if not shard.ok:
        return shard
    found: list[str] = []
    label = f"shard {shard.label}"
    if shard.replicas_online == 0:
        found.append(
            f"{label}: master {shard.address} has no replica online: a failover is impossible"
        )
    memory = snapshot["shards"][shard.index]
    if memory["fenced"]:
        found.append(f"{label}: writes held ({memory['fence_reason']})")
    if memory["error"]:
        found.append(f"{label}: the sentinels could not be asked: {memory['error']}")
    near = memory.get("near_cache")
    if near is not None and not near["tracked"]:
        found.append(
            f"{label}: the near cache is on but not tracking the master (nothing is kept or "
            "served locally; every read goes to the server)"
        )
    restart = memory["last_restart"]
    if restart is not None and time.time() - restart["at"] < RESTART_WARNING_SECONDS:
        found.append(
            f"{label}: master {restart['address']} restarted without a failover "
            f"{time.time() - restart['at']:.0f}s ago (run_id {restart['previous_run_id'] or 'unknown'}"
            f" -> {restart['run_id']}): its data was lost unless it persists it"
        )
    if not found:
        return shard
    return dataclasses.replace(shard, warnings=tuple(found), fenced=memory["fenced"])


def _deep_report(collected: Fanout[str, dict[str, Any]], deadline: float) -> dict[str, Any]:
    found = dict(collected.collect(deadline))
    if "deep" not in found:
        return {"state": None, "error": "the sentinels' view was not ready in time"}
    report = found["deep"]
    if isinstance(report, BaseException):
        return {"state": None, "error": describe(report)}
    return dict(report)


def _deep_messages(report: Mapping[str, Any]) -> list[str]:
    """What the sentinels' view adds: its problems, all of them warnings here (a shard whose
    probe worked serves, whatever the sentinels say)."""
    if report.get("state") is None:
        return [str(report.get("error"))]
    return [i["message"] for i in report.get("issues", ())]


# -- what the endpoints serve ------------------------------------------------------------------


def http_status(status: str, fail_on: str = HEALTH_FAIL_ON) -> int:
    """200, or 503 when ``status`` (a state, or the ``status`` word) fails under ``fail_on``:
    ``"down"``, or ``"degraded"`` too with ``fail_on="degraded"``."""
    return 503 if states.fails(state_of(status), fail_on) else 200


def summary(
    reports: Mapping[str, HealthReport | str],
    *,
    fail_on: str = HEALTH_FAIL_ON,
    key_prefixes: Mapping[str, Any] | None = None,
) -> tuple[int, dict[str, Any]]:
    """The HTTP status and the JSON body of a health endpoint over several caches.

    ``reports`` maps a cache's name (a Django alias) to its report, or to the text of the error
    that kept it from being checked (a configuration that does not parse: that cache is down).
    No cache at all is ``"down"`` too: the endpoint was set up for a cache that is not there.
    """
    caches: dict[str, dict[str, Any]] = {}
    problems: list[str] = []
    warnings: list[str] = []
    for name, report in reports.items():
        if isinstance(report, HealthReport):
            entry = report.as_dict()
            problems += [f"{name}: {p}" for p in report.problems]
            warnings += [f"{name}: {w}" for w in report.warnings]
        else:
            entry = {
                "state": DOWN,
                "status": DOWN,
                "ready": False,
                "degraded": False,
                "error": report,
            }
            problems.append(f"{name}: {report}")
        if key_prefixes is not None and name in key_prefixes:
            entry = {"key_prefix": key_prefixes[name], **entry}
        caches[name] = entry
    if not reports:
        problems.append("no sentinel_cache cache is configured")
    ready = not problems
    state = DOWN if not ready else DEGRADED if warnings else HEALTHY
    code = http_status(state, fail_on)
    body = {
        "state": state,
        "status": status_word(state),
        "ready": ready,
        "degraded": ready and bool(warnings),
        "fail_on": fail_on,
        "http_status": code,
        "problems": problems,
        "warnings": warnings,
        "caches": caches,
    }
    return code, body


def check_all(
    cores: Sequence[tuple[str, ShardedSentinelPool | str]],
    *,
    timeout: float | None = None,
    deep: bool = False,
) -> dict[str, HealthReport | str]:
    """:func:`check` every distinct core at once (caches with equal settings share one core:
    it is checked once); a name mapped to a string keeps that string (a configuration error)."""
    unique: dict[int, ShardedSentinelPool] = {}
    for _, core in cores:
        if not isinstance(core, str):
            unique.setdefault(id(core), core)
    if len(unique) == 1:
        ((key, only),) = unique.items()
        results: Mapping[int, HealthReport | BaseException] = {
            key: check(only, timeout=timeout, deep=deep)
        }
    else:
        longest = max((budget_for(core, timeout) for core in unique.values()), default=0.0)
        wait = longest * (4 if deep else 1) + 1.0  # each check keeps its own budget
        results = run_all(
            {
                key: functools.partial(check, core, timeout=timeout, deep=deep)
                for key, core in unique.items()
            },
            time.monotonic() + wait,
            "health-cores",
        )
    reports: dict[str, HealthReport | str] = {}
    for name, core in cores:
        if isinstance(core, str):
            reports[name] = core
            continue
        outcome = results[id(core)]
        reports[name] = (
            outcome if isinstance(outcome, HealthReport) else f"check failed: {describe(outcome)}"
        )
    return reports


def parse_fail_on(value: str | None, default: str = HEALTH_FAIL_ON) -> str:
    """A ``fail_on`` from a query string (``None``/empty: ``default``); ValueError if unknown."""
    return states.parse_fail_on(value, default)


def parse_flag(value: str | None) -> bool:
    """``?deep=1`` (``1``, ``true``, ``yes``, ``on``) as a bool."""
    return (value or "").strip().lower() in ("1", "true", "yes", "on")
