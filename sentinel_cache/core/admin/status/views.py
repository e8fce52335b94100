"""What the sentinels, taken together, say about each master name, and the words for each
shard problem."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from sentinel_cache.core.admin.states import describe
from sentinel_cache.core.admin.status.probes import (
    SENTINEL_AUTH_REFUSED,
    SENTINEL_NOT_SENTINEL,
    SentinelProbe,
)
from sentinel_cache.core.config import Address
from sentinel_cache.core.topology.discovery import config_epoch, monitored_hint, refusal

# A shard's problems (the report's ``problem``/``problem_codes``; :data:`PROBLEMS` has the words).
NOT_MONITORED = "not_monitored"
SENTINELS_UNREACHABLE = "sentinels_unreachable"
SENTINELS_AUTH_REFUSED = "sentinels_auth_refused"
SENTINELS_FAILED = "sentinels_failed"
MASTER_UNREACHABLE = "master_unreachable"
MASTER_AUTH_REFUSED = "master_auth_refused"
NOT_MASTER = "not_master"
SENTINELS_DISAGREE = "sentinels_disagree"
NO_REPLICA = "no_replica"
NO_QUORUM = "no_quorum"
QUORUM_UNKNOWN = "quorum_unknown"
FAILOVER_IN_PROGRESS = "failover_in_progress"

#: Every shard problem code, in words (what the text report says).
PROBLEMS: Mapping[str, str] = {
    NOT_MONITORED: "not monitored: no sentinel that answered monitors this master name",
    SENTINELS_UNREACHABLE: "no sentinel reachable",
    SENTINELS_AUTH_REFUSED: "authentication refused by the sentinels",
    SENTINELS_FAILED: "no sentinel answered (errors)",
    MASTER_UNREACHABLE: "master unreachable",
    MASTER_AUTH_REFUSED: "authentication refused by the master",
    NOT_MASTER: "the named master is not a master",
    SENTINELS_DISAGREE: "sentinels disagree about the master",
    NO_REPLICA: "no replica online",
    NO_QUORUM: "no quorum: the sentinels cannot authorize a failover",
    QUORUM_UNKNOWN: "the quorum check failed",
    FAILOVER_IN_PROGRESS: "failover in progress",
}


@dataclass
class MasterView:
    """What the sentinels, taken together, say about one master name.

    ``address`` is the master most of the answering sentinels name (None if none does);
    ``naming`` the sentinels that name it; ``not_monitoring`` those that answered they do not
    know the name; ``refused``, ``unreachable`` and ``failed`` those that gave no answer, and
    why. ``epoch`` is the highest config epoch of the sentinels naming ``address`` (it goes up
    with every failover) and ``failover`` names a failover of this master in progress.
    """

    name: str
    address: Address | None = None
    asked: list[Address] = field(default_factory=list)
    naming: list[Address] = field(default_factory=list)
    not_monitoring: list[Address] = field(default_factory=list)
    dissent: list[str] = field(default_factory=list)
    refused: list[tuple[Address, str]] = field(default_factory=list)
    hints: list[str] = field(default_factory=list)
    unreachable: list[tuple[Address, str]] = field(default_factory=list)
    failed: list[tuple[Address, str]] = field(default_factory=list)
    monitored: set[str] = field(default_factory=set)
    epoch: int | None = None
    failover: str | None = None

    @property
    def agreeing(self) -> int:
        return len(self.naming)

    @property
    def problem(self) -> str | None:
        """Why no sentinel named a master (None when one did): a sentinel that answered it
        does not know the name outweighs the ones that did not answer."""
        if self.address is not None:
            return None
        if self.not_monitoring:
            return NOT_MONITORED
        if self.refused:
            return SENTINELS_AUTH_REFUSED
        if self.failed:
            return SENTINELS_FAILED
        return SENTINELS_UNREACHABLE

    def explain(self) -> str:
        """In words, why no sentinel named a master ("" when one did)."""
        problem = self.problem
        if problem is None:
            return ""
        if problem == NOT_MONITORED:
            text = (
                f"not monitored: no sentinel monitors master {self.name!r} (asked "
                f"{', '.join(map(str, self.not_monitoring))}{self._silent()})"
            )
            return text + self.suggestion()
        if problem == SENTINELS_AUTH_REFUSED:
            return (
                f"no master known: authentication refused by the sentinels "
                f"({_pairs(self.refused)}{self._silent(refused=False)}); {'; '.join(self.hints)}"
            )
        if problem == SENTINELS_FAILED:
            return (
                f"no master known: no sentinel answered for {self.name!r} "
                f"({_pairs(self.failed)}{self._silent(failed=False)})"
            )
        return f"no master known: no sentinel reachable ({_pairs(self.unreachable)})"

    def suggestion(self) -> str:
        """ "; the sentinels monitor: ..." (with the likeliest intended name) for a name none of
        them monitors, so a typo in MASTERS explains itself (the run-time error says the same)."""
        return monitored_hint(self.name, self.monitored)

    def _silent(self, *, refused: bool = True, failed: bool = True) -> str:
        parts = [f"; no answer from {_pairs(self.unreachable)}"] if self.unreachable else []
        if refused and self.refused:
            parts.append(f"; authentication refused by {_pairs(self.refused)}")
        if failed and self.failed:
            parts.append(f"; errors from {_pairs(self.failed)}")
        return "".join(parts)


def _pairs(items: Sequence[tuple[Address, str]]) -> str:
    """``"a, b: why; c: why else"``: sentinels that failed alike are named together."""
    grouped: dict[str, list[str]] = {}
    for address, text in items:
        grouped.setdefault(text, []).append(str(address))
    return "; ".join(f"{', '.join(addresses)}: {text}" for text, addresses in grouped.items())


def master_view(name: str, probes: Sequence[SentinelProbe]) -> MasterView:
    """What the sentinels say about ``name``: the address most of them name (ties: the earlier
    sentinel), who agrees, and why each of the others did not (the report's words for it)."""
    view = MasterView(name, asked=[p.address for p in probes])
    votes: dict[Address, int] = {}
    for probe in probes:
        answer = probe.masters.get(name)
        if probe.reachable and isinstance(answer, Address):
            votes[answer] = votes.get(answer, 0) + 1
    view.address = max(votes, key=lambda a: votes[a]) if votes else None  # keeps the first tie
    for probe in probes:
        if probe.state == SENTINEL_AUTH_REFUSED:
            view.refused.append((probe.address, f"it {probe.refused} ({probe.error})"))
            if probe.hint and probe.hint not in view.hints:
                view.hints.append(probe.hint)
            continue
        if probe.state == SENTINEL_NOT_SENTINEL:  # answered, as a data node: no view at all
            role = f", ROLE {probe.role}" if probe.role else ""
            view.failed.append((probe.address, f"not a sentinel (a Redis data node{role})"))
            continue
        if not probe.reachable:
            view.unreachable.append((probe.address, str(probe.error)))
            continue
        view.monitored.update(probe.monitored or ())
        if name not in probe.masters:
            continue  # not asked about masters (a PING-only probe)
        answer = probe.masters[name]
        if view.address is not None and answer == view.address:
            view.naming.append(probe.address)
        elif answer is None:
            view.not_monitoring.append(probe.address)
            view.dissent.append(f"{probe.address} does not monitor {name!r}")
        elif isinstance(answer, BaseException):
            view.dissent.append(f"{probe.address}: {describe(answer)}")
            refused = refusal(answer, "sentinel")
            if refused is None:
                view.failed.append((probe.address, describe(answer)))
            else:
                view.refused.append((probe.address, f"it {refused[0]} ({describe(answer)})"))
                if refused[1] not in view.hints:
                    view.hints.append(refused[1])
        else:
            view.dissent.append(f"{probe.address} names {answer}")
    _read_epochs(view, probes)
    return view


def _read_epochs(view: MasterView, probes: Sequence[SentinelProbe]) -> None:
    """The config epoch of the named master and any failover in progress, from SENTINEL MASTER:
    the sentinels' own record of failovers, true for every process (the last-switch time of a
    pool is only what that process saw)."""
    epochs = []
    for probe in probes:
        detail = probe.details.get(view.name)
        if not probe.reachable or detail is None:
            continue
        if probe.address in view.naming:
            epochs.append(config_epoch(detail))
        flags = detail.get("flags", "").split(",")
        if "failover_in_progress" in flags and view.failover is None:
            state = detail.get("failover-state") or "started"
            view.failover = f"{state} on sentinel {probe.address}"
    view.epoch = max(epochs) if epochs else None


def unlisted_masters(probes: Sequence[SentinelProbe], listed: Sequence[str]) -> list[str]:
    """Masters the answering sentinels monitor that ``listed`` (MASTERS, PREVIOUS_MASTERS) does
    not name: a shard left out of MASTERS (or another application's masters, on shared
    sentinels). Keys never go to them, so a list one short places every key elsewhere."""
    monitored: set[str] = set()
    for probe in probes:
        if probe.reachable:
            monitored.update(probe.monitored or ())
    return sorted(monitored - set(listed))


def unlisted_warning(unlisted: Sequence[str]) -> str:
    """The words for :func:`unlisted_masters` (``sentinel_status`` and ``check --deploy``)."""
    one = len(unlisted) == 1
    return (
        f"the sentinels also monitor {', '.join(map(repr, unlisted))}, which MASTERS does not "
        f"list: if {'it is a shard' if one else 'they are shards'} of this cache, add "
        f"{'it' if one else 'them'} to MASTERS in ring order (keys go to the listed masters only)"
    )
