"""The package's layers, read from its imports: each layer imports only those below it, and no
module imports one that imports it back (also not through a deferred or ``TYPE_CHECKING``
import, which would hide a circle that a refactoring turns real).

From the bottom: the foundation (``exceptions``, ``core/*.py``), ``core/topology`` (who is
master), ``core/ops`` (the cache operations), ``core/admin`` (operator tools), then the
exporters, adapters and the test harness.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "sentinel_cache"


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(path): path for path in PACKAGE.rglob("*.py")}


def layer(module: str) -> int:
    """0 foundation, 1 topology, 2 ops, 3 admin, 4 exporters, adapters, the harness and the root
    package (whose lazy names point at the core's public classes)."""
    if module in ("sentinel_cache.exceptions", "sentinel_cache.version", "sentinel_cache.core"):
        return 0
    for prefix, rank in (
        ("sentinel_cache.core.topology", 1),
        ("sentinel_cache.core.ops", 2),
        ("sentinel_cache.core.admin", 3),
    ):
        if module == prefix or module.startswith(prefix + "."):
            return rank
    if module.startswith("sentinel_cache.core."):
        return 0
    return 4


def imports(module: str) -> set[str]:
    """Every module of the package that ``module`` imports, wherever the import statement is."""
    path = MODULES[module]
    found: set[str] = set()
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            names = [f"{base}.{alias.name}" for alias in node.names]
            names = [name if name in MODULES else base for name in names]
        else:
            continue
        for name in names:
            while name and name not in MODULES:  # `import a.b.c` names a, a.b and a.b.c
                name = name.rpartition(".")[0]
            if name.startswith("sentinel_cache") and name != module:
                found.add(name)
    return found


GRAPH = {module: imports(module) for module in MODULES}


def test_the_graph_is_read() -> None:
    """A reader that finds nothing would pass every rule below."""
    pool = "sentinel_cache.core.topology.sharded_pool"
    assert pool in GRAPH["sentinel_cache.core.ops.client"]
    assert "sentinel_cache.core.config" in GRAPH[pool]
    assert len(MODULES) > 40


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_go_down_the_layers(module: str) -> None:
    upward = sorted(name for name in GRAPH[module] if layer(name) > layer(module))
    assert not upward, f"{module} (layer {layer(module)}) imports a layer above it: {upward}"


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in sorted(graph.get(node, ())):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_circles_are_found() -> None:
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_circles() -> None:
    assert circles(GRAPH) == []
