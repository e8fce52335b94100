"""The one place the version is written (read by pyproject.toml, the root package, tracing)."""

__version__ = "0.1.0"
