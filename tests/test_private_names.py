"""No module of sentinel_cache imports another module's private (``_name``) names (issue 23):
what two modules share is public, so a reader sees what each module offers the others."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "sentinel_cache"
GENERATED_PACKAGES = {"_async", "_sync"}  # packages, not private names


def private_imports(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("sentinel_cache"):
            found += [
                f"{path.relative_to(PACKAGE.parent)}:{node.lineno}: {node.module}.{alias.name}"
                for alias in node.names
                if alias.name.startswith("_")
                and not alias.name.startswith("__")
                and alias.name not in GENERATED_PACKAGES
            ]
    return found


def test_no_private_name_is_imported_across_modules() -> None:
    modules = sorted(PACKAGE.rglob("*.py"))
    assert len(modules) > 40
    found = [line for path in modules for line in private_imports(path)]
    assert found == [], "\n".join(found)
