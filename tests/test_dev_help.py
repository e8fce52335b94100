"""``python -m sentinel_cache.testing ... --help`` states every default the commands use (issue
38: ``up --help`` did not say ``--down-after-ms`` defaults to 1000). No server is started."""

from __future__ import annotations

import argparse
import inspect

import pytest

from sentinel_cache.testing import LocalSentinelCluster
from sentinel_cache.testing.__main__ import _parser


def _subcommands() -> dict[str, argparse.ArgumentParser]:
    (found,) = [a for a in _parser()._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(found.choices)


@pytest.mark.parametrize("name", sorted(_subcommands()))
def test_every_option_with_a_value_says_its_default(name: str) -> None:
    parser = _subcommands()[name]
    for action in parser._actions:
        if not action.option_strings or action.help in (None, argparse.SUPPRESS):
            continue
        if action.nargs == 0:  # a flag: off unless given
            continue
        assert "default" in str(action.help), (name, action.option_strings, action.help)
        if action.default is not None:
            shown = f"{action.default:g}" if isinstance(action.default, float) else action.default
            assert str(shown) in str(action.help), (name, action.option_strings, action.help)


def test_up_help_states_the_topologys_sentinel_settings() -> None:
    defaults = inspect.signature(LocalSentinelCluster.__init__).parameters
    text = _subcommands()["up"].format_help().replace("\n", " ")
    text = " ".join(text.split())
    assert f"(default {defaults['down_after_ms'].default})" in text  # --down-after-ms: 1000
    assert f"failover-timeout {defaults['failover_timeout_ms'].default} ms" in text
    assert "quorum is a majority of --sentinels" in text
