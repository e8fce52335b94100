"""The network faults in force on a topology started with ``faults=True``: partitions and shaped
links, pushed to its :class:`~sentinel_cache.testing.faults.FaultProxy` as they change."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from sentinel_cache.testing.faults import FaultProxy


@dataclass
class _Partition:
    """One :meth:`LocalSentinelCluster.partition` call: how it was named and what it blocks."""

    label: str
    target: str
    blocks: list[tuple[str, str]]


class FaultControl:
    """Partitions and shapes by proxy peer id (``"client"`` or ``"127.0.0.1:port"``).

    The cluster resolves targets to peer ids; this keeps the state and tells the proxy.
    """

    def __init__(self, lock: threading.RLock) -> None:
        self._lock = lock
        self.partitions: list[_Partition] = []
        self.shapes: dict[str, tuple[float, float, float]] = {}

    def forget(self) -> None:
        """Drop the state without telling any proxy (the topology is being torn down)."""
        self.partitions.clear()
        self.shapes.clear()

    def partition(
        self, proxy: FaultProxy, label: str, me: str, others: Sequence[str], direction: str
    ) -> None:
        blocks: list[tuple[str, str]] = []
        for other in others:
            if direction in ("both", "inbound"):
                blocks.append((other, me))
            if direction in ("both", "outbound"):
                blocks.append((me, other))
        with self._lock:
            self.partitions.append(_Partition(label, me, blocks))
            self._push(proxy)

    def heal(self, proxy: FaultProxy, label: str | None, resolve: Callable[[], str]) -> None:
        """Lift the partitions named ``label`` (None: all), else those of ``resolve()``'s peer."""
        with self._lock:
            if label is None:
                self.partitions.clear()
            elif any(p.label == label for p in self.partitions):
                self.partitions = [p for p in self.partitions if p.label != label]
            else:
                me = resolve()
                self.partitions = [p for p in self.partitions if p.target != me]
            self._push(proxy)

    def shape(self, proxy: FaultProxy, me: str, **changes: float) -> None:
        with self._lock:
            delay, jitter, loss = self.shapes.get(me, (0.0, 0.0, 0.0))
            delay = changes.get("delay", delay)
            jitter = changes.get("jitter", jitter)
            loss = changes.get("loss", loss)
            if delay or jitter or loss:
                self.shapes[me] = (delay, jitter, loss)
            else:
                self.shapes.pop(me, None)
            self._push(proxy)

    def clear(self, proxy: FaultProxy) -> None:
        with self._lock:
            self.partitions.clear()
            self.shapes.clear()
            self._push(proxy)

    def describe(self) -> str:
        return f"faults({len(self.partitions)} partitions, {len(self.shapes)} shaped)"

    def _push(self, proxy: FaultProxy) -> None:
        blocks = sorted({b for p in self.partitions for b in p.blocks})
        proxy.set_state(blocks, self.shapes)
