"""The tracing tests' spans: one in-memory exporter on the process's tracer provider (installed
once, however many test modules ask), and our spans from it."""

from __future__ import annotations

from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

EXPORTER = InMemorySpanExporter()
_installed: list[bool] = []


def install() -> None:
    """Export every span of the process to :data:`EXPORTER` (a provider made if none is set)."""
    if _installed:
        return
    current = trace.get_tracer_provider()
    if not isinstance(current, TracerProvider):
        current = TracerProvider()
        trace.set_tracer_provider(current)
    current.add_span_processor(SimpleSpanProcessor(EXPORTER))
    _installed.append(True)


def ours(name: str) -> list[Any]:
    """The finished spans of our operation ``name``."""
    return [s for s in EXPORTER.get_finished_spans() if s.name == f"sentinel_cache {name}"]
