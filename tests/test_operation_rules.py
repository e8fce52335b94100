"""The rules every cache operation follows (near-cache eviction, resharding adoption and the
previous owner's cleanup) are applied in one place, from each operation's declared
:class:`~sentinel_cache.core.ops.plans.Access`: no operation calls them by hand, so a new one
cannot forget them. Read from the one source of the operations: every module of ``ops/_async``
(``client.py`` and the structures' modules beside it, ``hashes.py``, ``sets.py``, ...).
"""

from __future__ import annotations

import ast
from pathlib import Path

from sentinel_cache.core.ops import plans

SOURCES = sorted((Path(plans.__file__).resolve().parent / "_async").glob("*.py"))

# The rules' own machinery: the two runners, the near cache's part of a round trip, the
# resharding helpers themselves, and whole-shard work (a scan's batches, a flush), which has
# no declared keys.
RULE_HOMES = {
    "keyed": {"_move", "_drop_previous", "forget"},
    "planned": {"_move", "_drop_previous", "forget", "scatter", "durable_plan"},
    "_move": {"scatter", "_written", "_drop_previous"},
    "_with_adopted": {"adopt_many"},
    "_get_moving": {"scatter"},
    "adopt_many": {"scatter"},
    "_restore": {"scatter", "_written"},
    "_drop_previous": {"_written"},
    "_written": {"scatter", "durable_plan"},  # resharding's writes, with DURABLE_REPLICAS' WAIT
    "_unlink": {"forget", "scatter"},
    "clear": {"forget_shard", "scatter"},
    "get_many": {"scatter"},  # a read: its near-cache fill and fallback in one round trip
}
RULES = {
    "forget",
    "forget_shard",
    "_move",
    "_drop_previous",
    "adopt_many",
    "scatter",
    "_written",
    "durable_plan",
}


def calls_by_method() -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    classes = [node for source in SOURCES for node in ast.parse(source.read_text()).body]
    for cls in classes:
        if not isinstance(cls, ast.ClassDef):
            continue
        for method in cls.body:
            if isinstance(method, (ast.FunctionDef, ast.AsyncFunctionDef)):
                names = found.setdefault(method.name, set())
                for node in ast.walk(method):
                    if (
                        isinstance(node, ast.Call)
                        and isinstance(node.func, ast.Attribute)
                        and isinstance(node.func.value, ast.Name)
                        and node.func.value.id == "self"
                    ):
                        names.add(node.func.attr)
    return found


def test_the_source_is_read() -> None:
    calls = calls_by_method()
    assert {"get", "set", "delete", "delete_many", "keyed", "planned"} <= set(calls)
    assert "keyed" in calls["set"] and "planned" in calls["delete_many"]
    assert {"hset", "sadd", "sunionstore", "smove", "zadd", "zrange"} <= set(calls)
    assert "keyed" in calls["zadd"]  # the structures' modules too


def test_no_operation_applies_a_rule_by_hand() -> None:
    by_hand = {
        method: sorted((names & RULES) - RULE_HOMES.get(method, set()))
        for method, names in calls_by_method().items()
    }
    assert {method: rules for method, rules in by_hand.items() if rules} == {}


def test_every_access_is_declared_once() -> None:
    """The named accesses are the only ones, and each says something different."""
    accesses = [value for value in vars(plans).values() if isinstance(value, plans.Access)]
    assert len(accesses) == len(set(accesses)) == 6
