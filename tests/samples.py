"""Helpers the metrics tests share: a series' value in prometheus_client's default registry,
and a registry's command-duration series as text, to compare two ways of recording."""

from __future__ import annotations

import re

from prometheus_client import REGISTRY, CollectorRegistry, generate_latest

CALLS = "sentinel_cache_command_duration_seconds"
# On, below and between the first buckets, and past the last: every one of the bucket paths.
LATENCIES = (0.0001, 0.00005, 0.0003, 0.003, 0.7, 7.0)


def sample(name: str, **labels: str) -> float:
    """The sample ``name`` with ``labels`` (0 for one never recorded)."""
    return REGISTRY.get_sample_value(name, labels) or 0.0


def scrape(registry: CollectorRegistry) -> str:
    """The registry's command-duration lines, their creation times masked."""
    text = generate_latest(registry).decode()
    text = re.sub(r"(?m)^(\w+_created\{[^}]*\}) .*$", r"\1 <created>", text)
    return "\n".join(line for line in text.splitlines() if CALLS in line)
