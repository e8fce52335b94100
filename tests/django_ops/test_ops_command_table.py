"""The operator commands are declared once (``sentinel_cache.core.admin.commands``, issue 23) and
rendered by argparse (``manage.py sentinel_status``/``sentinel_reshard``) and click
(``flask sentinel-status``/``sentinel-reshard``): both front ends take the same options with the
same defaults and choices, read the same command line into the same values, and refuse a bad
value with exit code 3, naming the option. (Here, in the Django tests' directory, because Django
is configured once per process by this directory's conftest.)"""

from __future__ import annotations

import argparse
from io import StringIO
from typing import Any

import click
import pytest
from click.testing import CliRunner

from sentinel_cache.core.admin import commands
from sentinel_cache.flask import commands as flask_commands
from sentinel_cache.management.commands import sentinel_reshard, sentinel_status

FRONT_ENDS = [
    (commands.STATUS, sentinel_status.Command, flask_commands.sentinel_status_command),
    (commands.RESHARD, sentinel_reshard.Command, flask_commands.sentinel_reshard_command),
]
IDS = ["status", "reshard"]

# A command line giving every option a value other than its default.
EVERY_OPTION = {
    "sentinel_status": ["--cache", "main", "--json", "--watch", "0.5", "--timeout", "0.25",
                        "--fail-on", "down", "--iterations", "3"],
    "sentinel_reshard": ["--cache", "main", "--dry-run", "--rate", "100", "--match", "user:*",
                         "--json", "--sample", "50", "--batch", "20", "--retry-for", "2.5",
                         "--from-previous-cache"],
}  # fmt: skip


def django_parser(command_class: type[Any], name: str) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = command_class().create_parser("manage.py", name)
    return parser


def django_options(parser: argparse.ArgumentParser) -> dict[str, dict[str, Any]]:
    """Per flag: what argparse was told (Django's own options left out)."""
    ours = {}
    for action in parser._actions:  # argparse keeps its actions only there
        flags = [f for f in action.option_strings if f.startswith("--")]
        if not flags or flags[0] in DJANGO_OWN:
            continue
        ours[flags[0]] = {
            "dest": action.dest,
            "default": action.default,
            "choices": tuple(action.choices) if action.choices else (),
            "takes_value": action.nargs != 0,
            "optional_value": action.nargs == "?",
        }
    return ours


DJANGO_OWN = {
    "--help",
    "--version",
    "--verbosity",
    "--settings",
    "--pythonpath",
    "--traceback",
    "--no-color",
    "--force-color",
    "--skip-checks",
}


def click_options(command: click.Command) -> dict[str, dict[str, Any]]:
    ours = {}
    for param in command.params:
        if not isinstance(param, click.Option):
            continue
        choices = tuple(param.type.choices) if isinstance(param.type, click.Choice) else ()
        ours[param.opts[0]] = {
            "dest": param.name,
            "default": param.default,
            "choices": choices,
            "takes_value": not param.is_flag,
            # A value-taking option that also has a flag value may be given bare (--watch).
            "optional_value": not param.is_flag and isinstance(param.flag_value, float),
        }
    return ours


def table_options(spec: commands.Command) -> dict[str, dict[str, Any]]:
    return {
        o.flag: {
            "dest": o.dest,
            "default": o.default,
            "choices": o.choices,
            "takes_value": o.type is not bool,
            "optional_value": o.const is not None,
        }
        for o in spec.options
    }


@pytest.mark.parametrize(("spec", "django_command", "flask_command"), FRONT_ENDS, ids=IDS)
def test_both_front_ends_declare_the_table_s_options(
    spec: commands.Command, django_command: type[Any], flask_command: click.Command
) -> None:
    expected = table_options(spec)
    assert len(expected) >= 6
    assert django_options(django_parser(django_command, spec.django_name)) == expected
    assert click_options(flask_command) == expected
    assert flask_command.name == spec.flask_name


@pytest.mark.parametrize(("spec", "django_command", "flask_command"), FRONT_ENDS, ids=IDS)
def test_one_command_line_reads_the_same_in_both(
    spec: commands.Command, django_command: type[Any], flask_command: click.Command
) -> None:
    argv = EVERY_OPTION[spec.django_name]
    parsed = vars(django_parser(django_command, spec.django_name).parse_args(argv))
    from_django = {o.dest: parsed[o.dest] for o in spec.options}
    context = flask_command.make_context(spec.flask_name, list(argv))
    from_flask = {o.dest: context.params[o.dest] for o in spec.options}
    assert from_django == from_flask
    defaults = {o.dest: o.default for o in spec.options}
    assert all(from_django[dest] != default for dest, default in defaults.items()), from_django


def test_a_bare_watch_refreshes_every_two_seconds_in_both() -> None:
    parsed = django_parser(sentinel_status.Command, "sentinel_status").parse_args(["--watch"])
    context = flask_commands.sentinel_status_command.make_context("s", ["--watch", "--json"])
    assert parsed.watch == context.params["watch"] == commands.DEFAULT_WATCH_SECONDS == 2.0


# (command, arguments, the option the refusal must name)
BAD_VALUES = [
    (commands.STATUS, ["--timeout", "0"], "--timeout"),
    (commands.STATUS, ["--timeout", "soon"], "--timeout"),
    (commands.STATUS, ["--watch", "0"], "--watch"),
    (commands.STATUS, ["--fail-on", "sometimes"], "--fail-on"),
    (commands.RESHARD, ["--rate", "0"], "--rate"),
    (commands.RESHARD, ["--batch", "0"], "--batch"),
    (commands.RESHARD, ["--batch", "lots"], "--batch"),
    (commands.RESHARD, ["--retry-for", "-1"], "--retry-for"),
    (commands.RESHARD, ["--dry-run", "--sample", "0"], "--sample"),
    (commands.RESHARD, ["--sample", "10"], "--sample"),  # needs --dry-run
]


def run_django(name: str, argv: list[str]) -> tuple[int, str]:
    """As ``manage.py NAME ARGV`` does: (exit code, stderr)."""
    command = {"sentinel_status": sentinel_status, "sentinel_reshard": sentinel_reshard}[name]
    err = StringIO()
    with pytest.raises(SystemExit) as raised:
        command.Command(stderr=err).run_from_argv(["manage.py", name, *argv])
    return int(raised.value.code or 0), err.getvalue()


def _bad_value_id(value: Any) -> str:
    """Stable across processes (pytest-xdist's workers must collect the same ids)."""
    if isinstance(value, commands.Command):
        return value.django_name
    return " ".join(value) if isinstance(value, list) else str(value)


@pytest.mark.parametrize(("spec", "argv", "flag"), BAD_VALUES, ids=_bad_value_id)
def test_a_bad_value_is_refused_naming_the_option_in_both(
    spec: commands.Command,
    argv: list[str],
    flag: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, err = run_django(spec.django_name, argv)
    err += capsys.readouterr().err  # argparse's own errors go to sys.stderr
    assert code == 3, err
    assert flag in err, err
    flask_command = {
        commands.STATUS.flask_name: flask_commands.sentinel_status_command,
        commands.RESHARD.flask_name: flask_commands.sentinel_reshard_command,
    }[spec.flask_name]
    result = CliRunner().invoke(flask_command, argv)
    assert result.exit_code == 3, result.output
    assert flag in result.output, result.output


def test_the_table_s_rules_name_the_option_and_the_value() -> None:
    assert commands.STATUS.refusals({"timeout": 0.0}) == [
        "--timeout must be a positive number of seconds (got 0.0)"
    ]
    assert commands.RESHARD.refusals({"sample": 5, "dry_run": False}) == [
        "--sample needs --dry-run"
    ]
    assert commands.RESHARD.refusals({"sample": 5, "dry_run": True, "batch": 1}) == []
