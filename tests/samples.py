"""Helper the metrics tests share: a series' value in prometheus_client's default registry."""

from __future__ import annotations

from prometheus_client import REGISTRY


def sample(name: str, **labels: str) -> float:
    """The sample ``name`` with ``labels`` (0 for one never recorded)."""
    return REGISTRY.get_sample_value(name, labels) or 0.0
