"""``sentinel_reshard --from-previous-cache`` as a nemesis (issue 35): the migration that empties
the previous cache runs while the clients (``ADAPTERS["django adopting"]``) read, write and
delete the same hot keys, optionally with a planned failover landed inside one of its batches.

The migration runs the management command itself (the operator's path, ``--json``), in a
``spawn`` process of its own (Django is configured per process), started and set up *before*
the clients go, so that its batches meet the clients' first touches of the old keys (a cold
start costs about a second, by which time the clients have adopted every hot key). The process
takes the same planted faults (``patches``) and step hooks as a client process.

Why not ``multiprocessing.Pool``: the command ends with ``SystemExit(1)`` when a run is
incomplete ("run it again"), and a pool worker dies on a ``SystemExit`` without returning a
result, so ``Pool.apply`` waits for ever (the hang of the first attempt at this scenario). Here
the exit code is the outcome, and a process still running at its deadline has its threads'
stacks dumped (``faulthandler``) into the failure before it is killed.
"""

from __future__ import annotations

import faulthandler
import io
import itertools
import json
import multiprocessing
import os
import pickle
import tempfile
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import redis

from sentinel_cache.testing import LocalSentinelCluster

from . import final_masters, nemeses
from .checker import Verdict
from .nemeses_features import ADOPTING_PREFIX, OLD, REGISTER, Feature, prefill_old
from .recorder import (
    ADAPTERS,
    INFO,
    OK,
    OPS,
    Op,
    OpSpec,
    Read,
    StepHook,
    Workload,
    install_hooks,
    install_patches,
)
from .scenarios import judged, plan_for, record

#: The migration's pace: ``--rate 300`` is 30 keys a batch (``rate / 10``; ``--batch`` is the
#: SCAN's count), so the 600 hot keys would take two seconds of batches alone; the clients
#: adopt many of them meanwhile, so batches and clients meet on the same keys throughout.
RATE, BATCH = 300, 30
_RUNS = itertools.count()

#: How long a migration may take before it is judged hung (its stacks dumped, then killed):
#: 600 keys at RATE take 2 s alone (the long version's 2,400 keys 8 s); several times that.
#: Counted from when a strike inside a batch is over (the strike has its own bounds).
DEADLINE = 60.0


@dataclass
class Migrated:
    """One run of the command: its exit code (0 complete, 1 run again), its JSON report."""

    code: int | None
    report: dict[str, Any]
    stderr: str
    seconds: float

    def figures(self) -> str:
        cache = self.report.get("history", {})
        return (
            f"exit {self.code}, scanned {cache.get('scanned')}, moved {cache.get('moved')}, "
            f"already present {cache.get('already_present')}, gone {cache.get('expired')}, "
            f"complete {cache.get('complete')}, {self.seconds:.2f}s"
            + (f", errors {cache.get('errors')}" if cache.get("errors") else "")
        )


def _migration_main(
    sentinels: Any,
    options: Mapping[str, Any],
    patches: Sequence[tuple[str, str]],
    hooks: Sequence[StepHook],
    signals: Mapping[str, tuple[Any, Any]],
    control: Mapping[str, Any],
    args: Sequence[str],
    out: str,
    dump: str,
    dump_every: float,
) -> None:
    """The migration process: set Django up (the clients' settings), report ready, wait for
    go, run the command, write its outcome to ``out``. A run still going after
    ``dump_every`` seconds writes every thread's stack to ``dump`` (again each period)."""
    result: dict[str, Any] = {"code": None, "stdout": "", "stderr": "", "error": ""}
    try:
        install_patches(patches)
        if hooks:
            install_hooks(hooks, signals)
        ADAPTERS["django adopting"](sentinels, options)  # settings.configure + django.setup
        from django.core.management import call_command

        from sentinel_cache.management.commands.sentinel_reshard import Command as Reshard

        control["ready"].set()
        if not control["go"].wait(120):
            raise RuntimeError("never told to go")
        stdout, stderr = io.StringIO(), io.StringIO()
        with open(dump, "w") as stacks:
            faulthandler.dump_traceback_later(dump_every, repeat=True, file=stacks)
            began = time.monotonic()
            try:
                call_command(Reshard(), *args, stdout=stdout, stderr=stderr)
                result["code"] = 0
            except SystemExit as exc:  # the command's exit code: 1 is "run it again"
                result["code"] = exc.code
            finally:
                faulthandler.cancel_dump_traceback_later()
                result["seconds"] = time.monotonic() - began
        result["stdout"], result["stderr"] = stdout.getvalue(), stderr.getvalue()
    except BaseException:  # noqa: BLE001 - reported to the parent
        result["error"] = traceback.format_exc()
    finally:
        with open(out, "wb") as f:
            pickle.dump(result, f)


@dataclass
class MigrationProcess:
    """``sentinel_reshard --from-previous-cache --cache history --json`` in a spawned process
    configured as the clients are (``options``: the plan's, with the old cache's entry)."""

    sentinels: list[tuple[str, int]]
    options: dict[str, Any]
    patches: tuple[tuple[str, str], ...] = ()
    hooks: tuple[StepHook, ...] = ()
    args: tuple[str, ...] = ("--rate", str(RATE), "--batch", str(BATCH))
    deadline: float = DEADLINE
    runs: list[Migrated] = field(default_factory=list)

    def __repr__(self) -> str:
        return f"<MigrationProcess {len(self.runs)} runs {self.args}>"

    def prepare(self) -> None:
        """Start the process and wait until Django is set up in it (it then waits for go)."""
        ctx = multiprocessing.get_context("spawn")
        self.dir = tempfile.mkdtemp(prefix="history-migration-")
        self.control = {"ready": ctx.Event(), "go": ctx.Event()}
        self.signals = {h.step: (ctx.Event(), ctx.Event()) for h in self.hooks}
        n = len(self.runs)
        self.out = os.path.join(self.dir, f"run{n}.pickle")
        self.dump = os.path.join(self.dir, f"run{n}.stacks")
        args = ("--from-previous-cache", "--cache", "history", "--json", *self.args)
        self.proc = ctx.Process(
            target=_migration_main,
            args=(
                self.sentinels,
                self.options,
                self.patches,
                self.hooks,
                self.signals,
                self.control,
                args,
                self.out,
                self.dump,
                self.deadline / 3,
            ),
            name=f"history-migration-{n}",
            daemon=True,
        )
        self.proc.start()
        limit = time.monotonic() + 120
        while not self.control["ready"].wait(0.2):
            if not self.proc.is_alive() or time.monotonic() > limit:
                self.proc.kill()
                raise AssertionError(f"migration process not ready: {self._result()}")

    def go(self) -> None:
        self.control["go"].set()

    def step(self, name: str) -> tuple[Any, Any]:
        """The (reached, released) events of a step hook in the migration process."""
        return self.signals[name]

    def wait(self) -> Migrated:
        """The run's outcome; an AssertionError with every thread's stack if it is still
        running ``deadline`` seconds after go (then killed)."""
        self.proc.join(self.deadline)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(10)
            with open(self.dump) as f:
                stacks = f.read()
            raise AssertionError(
                f"--from-previous-cache still running {self.deadline}s after it started; "
                f"its threads' stacks:\n{stacks}"
            )
        result = self._result()
        if result.get("error"):
            raise AssertionError(f"the migration process failed:\n{result['error']}")
        try:
            report = json.loads(result["stdout"])
        except ValueError:
            report = {"unparsed": result["stdout"][:2000]}
        migrated = Migrated(result["code"], report, result["stderr"], result.get("seconds", 0))
        self.runs.append(migrated)
        return migrated

    def _result(self) -> dict[str, Any]:
        try:
            with open(self.out, "rb") as f:
                result: dict[str, Any] = pickle.load(f)
        except (FileNotFoundError, EOFError, pickle.UnpicklingError):
            return {"error": f"no outcome (exit code {self.proc.exitcode})"}
        return result


def migration_strike(
    process: MigrationProcess, during: nemeses.Strike | None = None, step: str = ""
) -> nemeses.Strike:
    """Go, and the strike is over when the migration is; with ``during``, that strike lands
    when the migration reaches the step hook ``step`` (it waits there until it is over)."""

    def strike(ctx: nemeses.Context) -> str:
        process.go()
        where = ""
        if during is not None:
            reached, released = process.step(step)
            try:
                if reached.wait(process.deadline):
                    where = f"; at its step {step}: {during(ctx)}"
                else:
                    where = f"; step {step} not reached: nothing struck"
            finally:
                released.set()
        return f"--from-previous-cache: {process.wait().figures()}{where}"

    return strike


# ------------------------------------------------------------------------- the final state


def _final_old(op: Op) -> list[Any]:
    return [Read(op.keys[0], op.value, True)] if op.kind == OK else []


#: The old cache read straight from its server once the migration is over: a key it still
#: holds is judged as the final read it would be to a reader (its value must not be one a
#: delete or a write replaced), and the test asserts there is none.
OPS["final_old_get"] = OpSpec(lambda r, w, v: ((), ()), lambda a, k, x: None, _final_old, weight=0)


def read_old(old: tuple[str, int], workload: Workload) -> list[Op]:
    """A ``final_old_get`` per register key the old server still holds (or could not be
    read): each one judged as a reader's final read, and named by the test."""
    server = redis.Redis(host=old[0], port=old[1], socket_timeout=5)
    out = []
    try:
        for n, key in enumerate(workload.keys):
            invoke = time.monotonic()
            try:
                data = server.get(f"{ADOPTING_PREFIX}:1:{key}")
                value = None if data is None else pickle.loads(data)  # noqa: S301 - ours
                kind, error = OK, ""
            except Exception as exc:  # noqa: BLE001 - recorded, never trusted
                value, kind, error = None, INFO, f"{type(exc).__name__}: {exc}"[:300]
            if kind == OK and value is None:
                continue  # gone from the old cache, as it should be
            done = time.monotonic()
            out.append(
                Op(0, "old", n, "final_old_get", (key,), (), invoke, done, kind, value, error)
            )
    finally:
        server.close()
    return out


@dataclass
class Outcome:
    verdict: Verdict
    runs: list[Migrated]
    left_on_old: list[str]


def run_migration_feature(
    feature: Feature,
    cluster: LocalSentinelCluster,
    run_seed: int,
    process: MigrationProcess,
    old_master: Callable[[], tuple[str, int]] | None = None,
) -> Outcome:
    """:func:`history.nemeses_features.run_feature` for an adoption with the migration: the old
    cache prefilled, the migration process set up before the clients go, its strike the
    scenario's; after the run, the migration run again if it asked for it (exit 1: its
    documented contract; the test says whether one run must do), then the final reads through
    the cache, from each master and from the old server, all judged. ``old_master``: where the
    old cache's master is now (a sentinel old cache fails over), else ``feature.old``."""
    scenario = feature.scenario
    assert feature.old is not None, "an adoption scenario names its old server"
    slug = "".join(c if c.isalnum() else "-" for c in scenario.name)[:24]
    workload = Workload.hot(f"h{run_seed}.{next(_RUNS)}:{slug}", keys=feature.keys)
    prefilled = prefill_old(feature.old, workload)
    options = {"MASTERS": list(cluster.master_names), **scenario.options}
    plan = plan_for(scenario, cluster, options, workload, run_seed, patches=(REGISTER,))
    process.sentinels = plan.sentinels
    process.options = options
    process.prepare()
    history, events, settled = record(scenario, cluster, plan, target=feature.target)
    if process.runs and process.runs[-1].code == 1:
        again = MigrationProcess(plan.sentinels, options, args=("--batch", "100"))
        again.prepare()
        again.go()
        process.runs.append(again.wait())
    history.ops = sorted(prefilled + history.ops, key=lambda op: op.invoke)
    plain = {k: v for k, v in options.items() if k != OLD}
    history.ops += final_masters.read_masters(cluster, "django", plain, workload)
    left = read_old(feature.old if old_master is None else old_master(), workload)
    history.ops += left
    history.events = events
    verdict = judged(scenario, history, scenario.modes, settled)
    return Outcome(verdict, process.runs, [op.keys[0] for op in left])
