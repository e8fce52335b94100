"""Flask settings -> one parse_cache_config call: every key, and errors raised by Cache(app).

These build the backend without touching a server (the core connects lazily), except where a
test says it checks the effect on real servers.
"""

from __future__ import annotations

import copy
import datetime as dt
import re
from typing import Any

import pytest
from cachelib.serializers import JSONSerializer
from flask import Flask
from flask_caching import Cache

from sentinel_cache import ConfigurationError
from sentinel_cache.core.config import Address
from sentinel_cache.core.serializers import Codec
from sentinel_cache.flask import CACHE_TYPE, COMMAND_NAME, ShardedSentinelCache, init_app

SENTINELS = ["127.0.0.1:26379", "127.0.0.1:26380"]
MASTERS = ["shard_a", "shard_b"]
BASE: dict[str, Any] = {
    "CACHE_TYPE": CACHE_TYPE,
    "CACHE_REDIS_SENTINELS": SENTINELS,
    "CACHE_REDIS_SENTINEL_MASTERS": MASTERS,
}


def build(**settings: Any) -> ShardedSentinelCache:
    app = Flask("config_tests")
    app.config.update({**BASE, **settings})
    cache = Cache(app)
    backend = app.extensions["cache"][cache]
    assert isinstance(backend, ShardedSentinelCache)
    return backend


def fails(match: str, **settings: Any) -> ConfigurationError:
    with pytest.raises(ConfigurationError, match=match) as info:
        build(**settings)
    return info.value


# -- sentinels and masters -------------------------------------------------------------------


@pytest.mark.parametrize(
    "sentinels",
    [
        SENTINELS,
        [("127.0.0.1", 26379), ("127.0.0.1", 26380)],
        "127.0.0.1:26379, 127.0.0.1:26380",
        ("127.0.0.1:26379", ("127.0.0.1", 26380)),
    ],
    ids=["strings", "pairs", "comma-string", "mixed-tuple"],
)
def test_sentinel_forms(sentinels: Any) -> None:
    backend = build(CACHE_REDIS_SENTINELS=sentinels)
    assert backend.pool_config.sentinels == (
        Address("127.0.0.1", 26379),
        Address("127.0.0.1", 26380),
    )
    assert backend.pool_config.masters == tuple(MASTERS)


def test_sentinel_url() -> None:
    backend = build(
        CACHE_REDIS_SENTINELS=None,
        CACHE_REDIS_SENTINEL_MASTERS=None,
        CACHE_REDIS_URL="sentinel://:s3cret@127.0.0.1:26379,127.0.0.1:26380/shard_a,shard_b?db=3",
    )
    config = backend.pool_config
    assert config.sentinels == (Address("127.0.0.1", 26379), Address("127.0.0.1", 26380))
    assert config.masters == ("shard_a", "shard_b")
    assert config.connection_options()["db"] == 3
    assert config.connection_options()["password"] == "s3cret"


def test_non_sentinel_url_is_ignored_next_to_sentinels() -> None:
    # Another extension's Redis URL may live in the same app.config.
    backend = build(CACHE_REDIS_URL="redis://localhost:6379/0")
    assert backend.pool_config.sentinels[0] == Address("127.0.0.1", 26379)


def test_url_and_sentinels_conflict() -> None:
    fails(
        "CACHE_REDIS_SENTINELS: the sentinels are also given by CACHE_REDIS_URL",
        CACHE_REDIS_URL="sentinel://127.0.0.1:26379/shard_a",
    )


def test_plain_redis_url_alone_is_rejected() -> None:
    fails(
        "CACHE_REDIS_URL: ShardedSentinelCache needs a sentinel:// URL",
        CACHE_REDIS_SENTINELS=None,
        CACHE_REDIS_URL="redis://localhost:6379/0",
    )


def test_sentinels_required() -> None:
    fails("CACHE_REDIS_SENTINELS: required", CACHE_REDIS_SENTINELS=None)
    fails("CACHE_REDIS_SENTINELS: required", CACHE_REDIS_SENTINELS=[])


@pytest.mark.parametrize(
    ("value", "why"),
    [
        (["127.0.0.1"], 'expected "host:port"'),
        (["127.0.0.1:99999"], "the port must be an integer"),
        (["127.0.0.1:26379", "127.0.0.1:26379"], "listed twice"),
        (42, "expected a list of sentinel addresses"),
    ],
)
def test_bad_sentinels_name_the_setting(value: Any, why: str) -> None:
    fails(f"^CACHE_REDIS_SENTINELS: .*{why}", CACHE_REDIS_SENTINELS=value)


def test_bad_url_names_the_setting() -> None:
    fails(
        "^CACHE_REDIS_URL: ",
        CACHE_REDIS_SENTINELS=None,
        CACHE_REDIS_URL="sentinel://127.0.0.1:notaport/shard_a",
    )


@pytest.mark.parametrize(
    ("query", "match"),
    [
        ("?wieghts=1,1", r"^CACHE_REDIS_URL: unknown option 'WIEGHTS'; did you mean 'WEIGHTS'"),
        ("?max_connections=0", "^CACHE_REDIS_URL: MAX_CONNECTIONS: must be an integer >= 1"),
    ],
)
def test_bad_url_query_names_the_url(query: str, match: str) -> None:
    fails(
        match,
        CACHE_REDIS_SENTINELS=None,
        CACHE_REDIS_SENTINEL_MASTERS=None,
        CACHE_REDIS_URL="sentinel://127.0.0.1:26379/shard_a" + query,
    )


def test_masters_required() -> None:
    fails("^CACHE_REDIS_SENTINEL_MASTERS: required", CACHE_REDIS_SENTINEL_MASTERS=None)


@pytest.mark.parametrize(
    ("typo", "meant", "unset"),
    [
        (
            "CACHE_REDIS_SENTINEL_MASTRES",
            "CACHE_REDIS_SENTINEL_MASTERS",
            "CACHE_REDIS_SENTINEL_MASTERS",
        ),
        (
            "CACHE_REDIS_SENTINEL_MASTERs",
            "CACHE_REDIS_SENTINEL_MASTERS",
            "CACHE_REDIS_SENTINEL_MASTERS",
        ),
        (
            "CACHE_REDIS_SENTINAL_MASTERS",
            "CACHE_REDIS_SENTINEL_MASTERS",
            "CACHE_REDIS_SENTINEL_MASTERS",
        ),
        ("CACHE_REDIS_SENTINEL", "CACHE_REDIS_SENTINELS", "CACHE_REDIS_SENTINELS"),
        ("CACHE_REDIS_SENTINELLS", "CACHE_REDIS_SENTINELS", "CACHE_REDIS_SENTINELS"),
    ],
)
def test_a_misspelled_required_setting_says_did_you_mean(typo: str, meant: str, unset: str) -> None:
    """Issue 38: "...MASTERS: required" alone left the typo to be found by eye."""
    error = fails(f"^{unset}: required", **{unset: None, typo: BASE[meant]})
    assert f"; {typo} is set, which is not read: did you mean {meant!r}?" in str(error)


def test_unrelated_settings_get_no_suggestion() -> None:
    error = fails("^CACHE_REDIS_SENTINEL_MASTERS: required", CACHE_REDIS_SENTINEL_MASTERS=None)
    assert "did you mean" not in str(error)  # Flask-Caching's own CACHE_* defaults are not typos


@pytest.mark.parametrize(
    ("value", "why"),
    [(["a", "a"], "listed twice"), ([], "at least one"), (["a b"], "white space")],
)
def test_bad_masters_name_the_setting(value: Any, why: str) -> None:
    fails(f"^CACHE_REDIS_SENTINEL_MASTERS: .*{why}", CACHE_REDIS_SENTINEL_MASTERS=value)


def test_single_master_spelling_of_redis_sentinel_cache() -> None:
    backend = build(CACHE_REDIS_SENTINEL_MASTERS=None, CACHE_REDIS_SENTINEL_MASTER="mymaster")
    assert backend.pool_config.masters == ("mymaster",)
    fails(
        "CACHE_REDIS_SENTINEL_MASTER: MASTERS is also set by CACHE_REDIS_SENTINEL_MASTERS",
        CACHE_REDIS_SENTINEL_MASTER="mymaster",
    )


def test_masters_in_options() -> None:
    backend = build(CACHE_REDIS_SENTINEL_MASTERS=None, CACHE_OPTIONS={"masters": ["x", "y"]})
    assert backend.pool_config.masters == ("x", "y")
    fails(
        r"CACHE_REDIS_SENTINEL_MASTERS: MASTERS is also set by CACHE_OPTIONS\['MASTERS'\]",
        CACHE_OPTIONS={"MASTERS": ["x"]},
    )


# -- passwords and database --------------------------------------------------------------------


def test_passwords_go_to_their_side() -> None:
    backend = build(CACHE_REDIS_PASSWORD="data-pw", CACHE_REDIS_SENTINEL_PASSWORD="sentinel-pw")
    assert backend.pool_config.connection_options()["password"] == "data-pw"
    assert backend.pool_config.sentinel_options()["password"] == "sentinel-pw"
    assert "data-pw" not in repr(backend.pool_config)


def test_empty_passwords_mean_none() -> None:
    backend = build(CACHE_REDIS_PASSWORD="", CACHE_REDIS_SENTINEL_PASSWORD="")
    assert "password" not in backend.pool_config.connection_options()
    assert "password" not in backend.pool_config.sentinel_options()


def test_password_set_twice() -> None:
    fails(
        r"^CACHE_REDIS_PASSWORD: PASSWORD is also set by CACHE_OPTIONS\['password'\]",
        CACHE_REDIS_PASSWORD="a",
        CACHE_OPTIONS={"password": "b"},
    )


def test_db() -> None:
    assert build(CACHE_REDIS_DB=4).pool_config.connection_options()["db"] == 4
    assert "db" not in build().pool_config.connection_options()
    fails(
        r"^CACHE_REDIS_DB: DB is also set by CACHE_OPTIONS\['DB'\]",
        CACHE_REDIS_DB=1,
        CACHE_OPTIONS={"DB": 2},
    )


def test_bad_db_fails_at_cache_app() -> None:
    try:
        build(CACHE_REDIS_DB="not-a-number")
    except ConfigurationError as exc:
        assert str(exc).startswith("CACHE_REDIS_DB")
    else:
        raise AssertionError("CACHE_REDIS_DB='not-a-number' was accepted")


# -- prefix, timeout, delete_many errors, CACHE_ARGS -----------------------------------------


def test_key_prefix() -> None:
    # Flask-Caching's own default prefix applies when CACHE_KEY_PREFIX is not set.
    assert build()._get_prefix() == "flask_cache_"
    assert build(CACHE_KEY_PREFIX="app:")._get_prefix() == "app:"
    assert build(CACHE_KEY_PREFIX=None)._get_prefix() == ""
    assert build(CACHE_KEY_PREFIX="")._get_prefix() == ""
    assert build(CACHE_KEY_PREFIX=lambda: "dyn:")._get_prefix() == "dyn:"
    fails("^CACHE_KEY_PREFIX: expected a string", CACHE_KEY_PREFIX=42)


def test_default_timeout() -> None:
    assert build().default_timeout == 300
    assert build(CACHE_DEFAULT_TIMEOUT=60).default_timeout == 60
    assert build(CACHE_DEFAULT_TIMEOUT=dt.timedelta(minutes=2)).default_timeout == 120
    assert build(CACHE_DEFAULT_TIMEOUT=0).default_timeout == 0
    with pytest.warns(DeprecationWarning, match="Float timeouts"):  # cachelib's rule
        assert build(CACHE_DEFAULT_TIMEOUT=2.5).default_timeout == 3
    fails("^CACHE_DEFAULT_TIMEOUT: must be >= 0", CACHE_DEFAULT_TIMEOUT=-1)
    fails("^CACHE_DEFAULT_TIMEOUT: expected whole seconds", CACHE_DEFAULT_TIMEOUT=True)
    fails("^CACHE_DEFAULT_TIMEOUT: expected whole seconds", CACHE_DEFAULT_TIMEOUT=[1])


def test_ignore_delete_many_errors() -> None:
    assert build().ignore_delete_many_errors is False
    assert build(CACHE_IGNORE_ERRORS=True).ignore_delete_many_errors is True


def test_cache_args_rejected() -> None:
    fails("^CACHE_ARGS: ShardedSentinelCache takes no positional arguments", CACHE_ARGS=["x"])


# -- CACHE_OPTIONS ---------------------------------------------------------------------------


def test_options_are_the_django_names_case_insensitive() -> None:
    backend = build(
        CACHE_OPTIONS={
            "weights": [1, 3],
            "Max_Connections": 7,
            "SOCKET_TIMEOUT": 1.5,
            "SENTINEL_SOCKET_TIMEOUT": 0.25,
            "IGNORE_EXCEPTIONS": True,
            "DURABLE_REPLICAS": 1,
            "LISTENERS": False,
        }
    )
    config = backend.pool_config
    assert config.weights == (1, 3)
    assert config.max_connections == 7
    assert config.listeners is False
    assert config.connection_options()["socket_timeout"] == 1.5
    assert config.sentinel_options()["socket_timeout"] == 0.25
    assert backend.options.ignore_exceptions is True
    assert backend.client.durable_replicas == 1


def test_options_do_not_leak_flask_caching_kwargs() -> None:
    # Flask-Caching merges CACHE_OPTIONS into its own kwargs (default_timeout, ...).
    backend = build(CACHE_OPTIONS={"default_timeout": 11, "ignore_delete_many_errors": True})
    assert backend.default_timeout == 11
    assert backend.ignore_delete_many_errors is True


def test_unknown_option_suggests_the_nearest() -> None:
    error = fails(
        r"^CACHE_OPTIONS: unknown option 'WIEGHTS'; did you mean 'WEIGHTS'\?",
        CACHE_OPTIONS={"WIEGHTS": [1, 1]},
    )
    assert "MAX_CONNECTIONS" not in str(error)  # the closest name, not all of them


def test_option_spelled_twice() -> None:
    fails("^CACHE_OPTIONS: 'db' and 'DB' name the same option", CACHE_OPTIONS={"db": 1, "DB": 2})


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"WEIGHTS": [1, 2, 3]}, r"\['WEIGHTS'\]: 3 weights for 2 masters"),
        ({"WEIGHTS": [1, 0]}, r"\['WEIGHTS'\]: every weight must be a positive integer"),
        ({"MAX_CONNECTIONS": 0}, r"\['MAX_CONNECTIONS'\]: must be an integer >= 1"),
        ({"SERIALIZER": "yaml"}, r"\['SERIALIZER'\]: expected"),
        ({"SIGNING_KEY": "short"}, r"\['SIGNING_KEY'\]: must be .* at least 16"),
        ({"IGNORE_EXCEPTIONS": "yes"}, r"\['IGNORE_EXCEPTIONS'\]: must be True or False"),
        ({"CONNECTION_KWARGS": {"sokcet_timeout": 1}}, "did you mean 'socket_timeout'"),
    ],
)
def test_bad_option_values_name_cache_options(options: dict[str, Any], match: str) -> None:
    error = fails(match, CACHE_OPTIONS=options)
    assert str(error).startswith("CACHE_OPTIONS"), str(error)
    assert isinstance(error.__cause__, ConfigurationError)


def test_serializer_option_builds_the_codec() -> None:
    backend = build(CACHE_OPTIONS={"SERIALIZER": "json", "COMPRESSOR": "zlib"})
    assert isinstance(backend.serializer, Codec)
    assert backend.serializer.serializer_name == "json"
    assert backend.serializer.compressor_name == "zlib"
    assert backend.client.codec is backend.serializer


def test_cache_serializer_is_assigned_by_flask_caching() -> None:
    serializer = JSONSerializer()
    backend = build(CACHE_SERIALIZER=serializer)
    assert backend.serializer is serializer
    assert backend.client.codec.serializer_name.endswith("JSONSerializer")


def test_bad_serializer_assignment() -> None:
    backend = build()
    with pytest.raises(ConfigurationError, match="^CACHE_SERIALIZER: expected an object"):
        backend.serializer = object()


# -- app.config, registry, command -------------------------------------------------------------


def test_app_config_is_never_mutated() -> None:
    app = Flask("immutable")
    app.config.update({**BASE, "CACHE_OPTIONS": {"WEIGHTS": [1, 2]}, "CACHE_REDIS_PASSWORD": "pw"})
    before = copy.deepcopy(dict(app.config))
    Cache(app)
    assert dict(app.config) == before


def test_equal_settings_share_one_core() -> None:
    first, second = build(CACHE_KEY_PREFIX="a:"), build(CACHE_KEY_PREFIX="b:")
    assert first.core is second.core
    assert first.client is not second.client
    assert build(CACHE_REDIS_DB=5).core is not first.core


def test_command_is_registered_by_the_factory() -> None:
    app = Flask("cli")
    app.config.update(BASE)
    assert COMMAND_NAME not in app.cli.commands
    Cache(app)
    assert COMMAND_NAME in app.cli.commands
    Cache(app, config={"CACHE_KEY_PREFIX": "second:"})  # a second cache: registered once
    init_app(app)
    assert list(app.cli.commands).count(COMMAND_NAME) == 1


# -- structured errors: renamed for Flask from the core's option, value and reason -------------


@pytest.mark.parametrize(
    ("settings", "option", "value"),
    [
        ({"CACHE_OPTIONS": {"max_connections": 0}}, "CACHE_OPTIONS['max_connections']", 0),
        ({"CACHE_REDIS_DB": "x"}, "CACHE_REDIS_DB", "x"),
        ({"CACHE_REDIS_SENTINELS": ["nohost"]}, "CACHE_REDIS_SENTINELS", "nohost"),
        ({"CACHE_OPTIONS": {"WIEGHTS": [1, 1]}}, "CACHE_OPTIONS", "WIEGHTS"),
        ({"CACHE_OPTIONS": {"SIGNING_KEY": "short-secret"}}, "CACHE_OPTIONS['SIGNING_KEY']", "***"),
    ],
)
def test_renamed_errors_keep_value_and_reason(settings: dict, option: str, value: Any) -> None:
    error = fails("^" + re.escape(f"{option}: "), **settings)
    assert (error.option, error.value) == (option, value)
    assert str(error) == f"{option}: {error.reason}"
    core = error.__cause__
    assert isinstance(core, ConfigurationError)
    assert core.reason == error.reason and core.value == error.value


def test_url_errors_name_the_url_setting() -> None:
    url = {"CACHE_REDIS_SENTINELS": None, "CACHE_REDIS_SENTINEL_MASTERS": None}
    error = fails("^CACHE_REDIS_URL: ", CACHE_REDIS_URL="sentinel://h:1/a?wieghts=1", **url)
    assert (error.option, error.value) == ("CACHE_REDIS_URL", "WIEGHTS")
    assert error.reason.startswith("unknown option 'WIEGHTS'")
    # An option from the query string: the URL setting, then the option the core named.
    error = fails("^CACHE_REDIS_URL: ", CACHE_REDIS_URL="sentinel://h:1/a?max_connections=x", **url)
    assert (error.option, error.value) == ("CACHE_REDIS_URL", "x")
    assert error.reason == "MAX_CONNECTIONS: must be an integer >= 1 (got 'x')"


def test_missing_masters_is_a_missing_value() -> None:
    error = fails("^CACHE_REDIS_SENTINEL_MASTERS: required", CACHE_REDIS_SENTINEL_MASTERS=None)
    assert (error.option, error.value) == ("CACHE_REDIS_SENTINEL_MASTERS", None)
    assert error.reason == "required, the ordered list of master names"
