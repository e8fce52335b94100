"""What a change of the shard list moves, from the two rings alone (no server is asked)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sentinel_cache.core.ring import HASH_SPACE, HIGHEST_HASH, LOWEST_HASH, ring_nodes
from sentinel_cache.core.topology.sharded_pool import ShardedSentinelPool
from sentinel_cache.exceptions import ConfigurationError

__all__ = ["EXCESS", "Movement", "Shift", "movement", "movement_of", "require_previous"]

EXCESS = 0.01  # a change moving more than the least possible + this fraction is warned about


def require_previous(core: ShardedSentinelPool) -> None:
    if core.previous_ring is None:
        raise ConfigurationError(
            option="PREVIOUS_MASTERS",
            value=None,
            reason="not set: nothing to migrate. Deploy the new MASTERS with PREVIOUS_MASTERS "
            "(and PREVIOUS_WEIGHTS if the weights changed) naming the placement before the "
            "change, then run the migration (see docs/resharding.md)",
        )


@dataclass(frozen=True)
class Shift:
    """A master kept in the list at another position (Jedis places keys by position)."""

    name: str
    previous: int
    current: int


@dataclass(frozen=True)
class Movement:
    """What a change of the shard list moves, from the two rings alone (no key is read).

    Fractions are of the hash space, so of the keys when keys hash evenly (they do: MurmurHash).
    ``pairs`` maps (from master, to master) to the fraction moving between them; ``minimal`` is
    the least any placement could move for the new shares (half the sum of the share changes per
    master: an append or a removal of the last master moves exactly that).
    """

    previous: tuple[str, ...]
    previous_weights: tuple[int, ...]
    masters: tuple[str, ...]
    weights: tuple[int, ...]
    pairs: tuple[tuple[str, str, float], ...]
    fraction: float
    minimal: float
    shifted: tuple[Shift, ...]
    warnings: tuple[str, ...]
    suggestion: tuple[tuple[str, ...], tuple[int, ...], float] | None = None

    @property
    def excessive(self) -> bool:
        return self.fraction > self.minimal + EXCESS

    def to_dict(self) -> dict[str, Any]:
        suggestion = None
        if self.suggestion is not None:
            names, weights, fraction = self.suggestion
            suggestion = {"masters": list(names), "weights": list(weights), "fraction": fraction}
        return {
            "previous_masters": list(self.previous),
            "previous_weights": list(self.previous_weights),
            "masters": list(self.masters),
            "weights": list(self.weights),
            "fraction": self.fraction,
            "minimal_fraction": self.minimal,
            "pairs": [{"from": a, "to": b, "fraction": f} for a, b, f in self.pairs],
            "shifted": [
                {"master": s.name, "previous_position": s.previous, "position": s.current}
                for s in self.shifted
            ],
            "warnings": list(self.warnings),
            "suggestion": suggestion,
        }


def _flows(
    previous: Sequence[str],
    previous_weights: Sequence[int],
    masters: Sequence[str],
    weights: Sequence[int],
) -> tuple[dict[tuple[str, str], float], dict[str, float], dict[str, float]]:
    """Fraction of the hash space per (previous owner, owner) name pair (equal names included),
    and each master's share before and after."""
    old, new = ring_nodes(previous_weights), ring_nodes(weights)
    points = sorted({h for h, _ in old} | {h for h, _ in new})
    flows: dict[tuple[str, str], float] = {}
    i = j = 0
    last = None
    for point in points:
        # A key hashing into (last, point] belongs to the first node >= point of each ring;
        # the first interval also takes the wrap-around (above the last point, below the first).
        while i < len(old) and old[i][0] < point:
            i += 1
        while j < len(new) and new[j][0] < point:
            j += 1
        a = previous[old[i][1] if i < len(old) else old[0][1]]
        b = masters[new[j][1] if j < len(new) else new[0][1]]
        wrap = (point - LOWEST_HASH + 1) + (HIGHEST_HASH - points[-1])
        length = wrap if last is None else point - last
        last = point
        flows[(a, b)] = flows.get((a, b), 0.0) + length / HASH_SPACE
    before: dict[str, float] = {}
    after: dict[str, float] = {}
    for (a, b), share in flows.items():
        before[a] = before.get(a, 0.0) + share
        after[b] = after.get(b, 0.0) + share
    return flows, before, after


def _moved_fraction(flows: Mapping[tuple[str, str], float]) -> float:
    return sum(share for (a, b), share in flows.items() if a != b)


def _suggest(
    previous: Sequence[str], masters: Sequence[str], weights: Sequence[int]
) -> tuple[tuple[str, ...], tuple[int, ...]]:
    """The same masters and weights placed to move less: every kept master at its previous
    position, a new master in a removed one's position (the position kept, the master behind
    it swapped), other new masters appended, and a hole left by a removal filled by the last
    master rather than by shifting every later one."""
    weight_of = dict(zip(masters, weights, strict=True))
    added = [name for name in masters if name not in previous]
    slots: list[str | None] = []
    for name in previous:
        if name in weight_of:
            slots.append(name)
        else:
            slots.append(added.pop(0) if added else None)
    slots.extend(added)
    while None in slots:
        while slots and slots[-1] is None:
            slots.pop()
        if None in slots:
            slots[slots.index(None)] = slots.pop()
    names = tuple(name for name in slots if name is not None)
    return names, tuple(weight_of[name] for name in names)


def movement(
    previous: Sequence[str],
    previous_weights: Sequence[int] | None,
    masters: Sequence[str],
    weights: Sequence[int] | None = None,
) -> Movement:
    """What changing the shard list from ``previous`` to ``masters`` moves (weights default to
    1 each), with warnings when it moves far more than needed and what to do instead."""
    previous = tuple(previous)
    masters = tuple(masters)
    previous_weights = tuple(previous_weights or (1,) * len(previous))
    weights = tuple(weights or (1,) * len(masters))
    flows, before, after = _flows(previous, previous_weights, masters, weights)
    fraction = _moved_fraction(flows)
    names = set(before) | set(after)
    minimal = sum(abs(after.get(n, 0.0) - before.get(n, 0.0)) for n in names) / 2
    shifted = tuple(
        Shift(name, i, masters.index(name))
        for i, name in enumerate(previous)
        if name in masters and masters.index(name) != i
    )
    warnings: list[str] = []
    suggestion = None
    if previous == masters and previous_weights == weights:
        warnings.append("PREVIOUS_MASTERS and MASTERS (and their weights) are equal: nothing moves")
    for shift in shifted:
        warnings.append(
            f"master {shift.name} moves from position {shift.previous} to {shift.current}: "
            "Jedis places keys by position, not by name, so the keys of both positions move"
        )
    if fraction > minimal + EXCESS:
        warnings.append(
            f"this change moves {fraction:.1%} of the keys; the least any placement could move "
            f"for the new shares is {minimal:.1%}"
        )
        removed_inside = [
            name
            for i, name in enumerate(previous)
            if name not in masters and any(n in masters for n in previous[i + 1 :])
        ]
        inserted = [
            name
            for j, name in enumerate(masters)
            if name not in previous and any(n in previous for n in masters[j + 1 :])
        ]
        for name in removed_inside:
            warnings.append(
                f"{name} is removed from the middle of the list, which shifts every later "
                "master: to retire the machine behind it, keep the name at its position and "
                "move it to other hardware with a Sentinel failover (nothing moves); to have "
                "fewer shards, remove the last master instead (only its keys move)"
            )
        for name in inserted:
            warnings.append(
                f"{name} is inserted before existing masters: append new masters at the end "
                f"instead (only their share, about 1/{len(masters)} each, moves)"
            )
        if not removed_inside and not inserted and shifted:
            warnings.append("masters are reordered: keep the previous order")
        names_s, weights_s = _suggest(previous, masters, weights)
        if names_s != masters:
            flows_s, _, _ = _flows(previous, previous_weights, names_s, weights_s)
            fraction_s = _moved_fraction(flows_s)
            if fraction_s < fraction - EXCESS:
                suggestion = (names_s, weights_s, fraction_s)
                text = f"MASTERS = {list(names_s)!r}"
                if weights_s != (1,) * len(names_s):
                    text += f", WEIGHTS = {list(weights_s)!r}"
                warnings.append(
                    f"{text} (the same masters) would move {fraction_s:.1%} instead of "
                    f"{fraction:.1%} (Java services using Jedis need the same order)"
                )
    pairs = tuple(
        sorted(((a, b, share) for (a, b), share in flows.items() if a != b), key=lambda p: p[:2])
    )
    return Movement(
        previous=previous,
        previous_weights=previous_weights,
        masters=masters,
        weights=weights,
        pairs=pairs,
        fraction=fraction,
        minimal=minimal,
        shifted=shifted,
        warnings=tuple(warnings),
        suggestion=suggestion,
    )


def movement_of(core: ShardedSentinelPool) -> Movement:
    """:func:`movement` for a core's ``PREVIOUS_MASTERS`` -> ``MASTERS``."""
    require_previous(core)
    config = core.config
    return movement(
        config.previous_masters, config.previous_weights, config.masters, config.weights
    )
