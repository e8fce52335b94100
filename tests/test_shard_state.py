"""A shard's state (address, generation, evidence, fence, error, resolution) changes only through
``Shard``'s own methods: the failover state machine has one home, ``core/topology/shard.py``
(its replicas' part in ``replicas.py``, a base class of ``Shard``).

Two checks: the code outside those two modules never assigns a shard's attribute (read from the
source, so a write on a path no test runs is caught too), and a real ``Shard`` refuses the
assignment of every state name it shows (so a test or an adapter cannot poke it either).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from sentinel_cache.core.config import PoolConfig
from sentinel_cache.core.topology.shard import Shard

PACKAGE = Path(__file__).resolve().parent.parent / "sentinel_cache"
TOPOLOGY = PACKAGE / "core" / "topology"
# Each module of the shard's state, and its class there.
SHARD_CLASSES = {TOPOLOGY / "shard.py": "Shard", TOPOLOGY / "replicas.py": "ShardReplicas"}


def shard_classes() -> list[ast.ClassDef]:
    found = []
    for path, name in SHARD_CLASSES.items():
        tree = ast.parse(path.read_text(), str(path))
        found += [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name]
    assert len(found) == len(SHARD_CLASSES)
    return found


def assigned_targets(node: ast.AST) -> list[ast.expr]:
    """What an assignment, augmented or annotated assignment, or ``del`` writes to."""
    if isinstance(node, ast.Assign):
        found: list[ast.expr] = []
        for target in node.targets:
            found.extend(target.elts if isinstance(target, (ast.Tuple, ast.List)) else [target])
        return found
    if isinstance(node, (ast.AugAssign, ast.AnnAssign)):
        return [node.target]
    if isinstance(node, ast.Delete):
        return list(node.targets)
    return []


def state_names() -> set[str]:
    """Every attribute ``Shard`` keeps on itself, and every property it shows (both spellings:
    ``_address`` and ``address``)."""
    names: set[str] = set()
    for node in (node for cls in shard_classes() for node in ast.walk(cls)):
        if isinstance(node, ast.FunctionDef) and any(
            isinstance(d, ast.Name) and d.id == "property" for d in node.decorator_list
        ):
            names.add(node.name)
        for target in assigned_targets(node):
            if (
                isinstance(target, ast.Attribute)
                and isinstance(target.value, ast.Name)
                and target.value.id == "self"
            ):
                names.update({target.attr, target.attr.lstrip("_")})
    return names


SHARD_TEXT = re.compile(r"(^|\.|_)shard$|(^|\.|_)(shards|every_shard|departed)\[.*\]$")


def shard_names(function: ast.AST) -> set[str]:
    """The names a function calls shards: its parameters annotated ``Shard``, and the variables
    of its ``for`` loops over a core's shards."""
    names: set[str] = set()
    for node in ast.walk(function):
        if isinstance(node, ast.arg) and node.annotation is not None:
            if re.search(r"\bShard\b", ast.unparse(node.annotation)):
                names.add(node.arg)
        elif (
            isinstance(node, (ast.For, ast.comprehension))
            and isinstance(node.target, ast.Name)
            and re.search(r"(shards|every_shard|departed)\b", ast.unparse(node.iter))
        ):
            names.add(node.target.id)
    return names


def is_shard(expression: ast.expr, names: set[str]) -> bool:
    if isinstance(expression, ast.Name) and expression.id in names:
        return True
    return SHARD_TEXT.search(ast.unparse(expression)) is not None


def outside_writes(root: Path) -> list[str]:
    """``path:line: text`` of every write to a shard's state outside its modules: an assignment
    (of any kind, or a ``del``) to ``<a shard>.<state name>``, or ``setattr(<a shard>, ...)``."""
    state = state_names()
    found: list[str] = []
    for path in sorted(root.rglob("*.py")):
        if path in SHARD_CLASSES:
            continue
        tree = ast.parse(path.read_text(), str(path))
        functions = [
            n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
        ]
        scopes: list[tuple[ast.AST, set[str]]] = [(tree, set())]
        scopes += [(function, shard_names(function)) for function in functions]
        for scope, names in scopes:
            for node in ast.walk(scope):
                writes = [
                    t
                    for t in assigned_targets(node)
                    if isinstance(t, ast.Attribute) and t.attr in state and is_shard(t.value, names)
                ]
                if (
                    isinstance(node, ast.Call)
                    and isinstance(node.func, ast.Name)
                    and node.func.id in ("setattr", "delattr")
                    and node.args
                    and is_shard(node.args[0], names)
                ):
                    writes.append(node.args[0])
                found += [
                    f"{path.relative_to(root.parent)}:{w.lineno}: {ast.unparse(w)}" for w in writes
                ]
    return sorted(set(found))


def test_the_state_names_are_read() -> None:
    """A reader that finds no names would pass the scan below."""
    assert {"address", "generation", "evidence", "error", "agreeing", "fence_since"} <= (
        state_names()
    )
    assert {"replicas", "serving_replicas", "in_step", "down"} <= state_names()  # replicas.py


def test_the_scan_finds_a_write(tmp_path: Path) -> None:
    """The scan below must see the shapes a write to a shard takes."""
    root = tmp_path / "sentinel_cache"
    root.mkdir()
    (root / "bad.py").write_text(
        "def f(core, s: Shard, x):\n"
        "    shard = core.shards[0]\n"
        "    shard.error = x\n"
        "    core.shards[1].last_resolve = 0.0\n"
        "    s.agreeing += 1\n"
        "    self._shard.generation = 3\n"
        "    setattr(shard, 'evidence', x)\n"
        "    for other in core.every_shard:\n"
        "        other.fence_reason = None\n"
        "    state = x\n"
        "    state.generation = 2\n"  # not a shard: a near-cache state has its own generation
    )
    assert [line.split(": ", 1)[1] for line in outside_writes(root)] == [
        "shard.error",
        "core.shards[1].last_resolve",
        "s.agreeing",
        "self._shard.generation",
        "shard",
        "other.fence_reason",
    ]


def test_no_code_outside_the_shard_modules_assigns_a_shard_state_field() -> None:
    assert outside_writes(PACKAGE) == []


@pytest.mark.parametrize(
    "name",
    sorted(
        name
        for name in state_names()
        if not name.startswith("_") and isinstance(getattr(Shard, name, None), property)
    ),
)
def test_a_shard_refuses_an_outside_write_to_its_state(name: str) -> None:
    shard = Shard(0, "shard0", 1, PoolConfig.create(["shard0"], "127.0.0.1:1"))
    try:
        with pytest.raises(AttributeError):
            setattr(shard, name, getattr(shard, name))
    finally:
        shard.close()


def test_every_state_field_shown_is_a_property() -> None:
    """The public state of a shard is read through properties (settable nowhere): what
    ``Shard.__init__`` keeps as a plain public attribute is its identity and its clients."""
    shard = Shard(0, "shard0", 1, PoolConfig.create(["shard0"], "127.0.0.1:1"))
    try:
        plain = {name for name in vars(shard) if not name.startswith("_")}
    finally:
        shard.close()
    assert plain <= {"index", "name", "weight", "label", "pool", "client"}, plain
