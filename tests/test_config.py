"""Configuration: every bad input fails fast with the field and value in the message."""

from __future__ import annotations

import pytest

from sentinel_cache import ConfigurationError
from sentinel_cache.core.config import (
    Address,
    PoolConfig,
    parse_cache_config,
    parse_sentinels,
    parse_url,
)


def test_sentinel_forms_are_equivalent() -> None:
    expected = (Address("10.0.0.1", 26379), Address("10.0.0.2", 26380))
    assert parse_sentinels(["10.0.0.1:26379", "10.0.0.2:26380"]) == expected
    assert parse_sentinels([("10.0.0.1", 26379), ("10.0.0.2", "26380")]) == expected
    assert parse_sentinels("10.0.0.1:26379, 10.0.0.2:26380") == expected


def test_ipv6_sentinel() -> None:
    assert parse_sentinels("[::1]:26379") == (Address("::1", 26379),)
    assert str(Address("::1", 26379)) == "[::1]:26379"


@pytest.mark.parametrize(
    ("sentinels", "fragment"),
    [
        ([], "at least one sentinel"),
        ("", "at least one sentinel"),
        (["localhost"], "localhost"),
        (["localhost:abc"], "localhost:abc"),
        (["localhost:0"], "localhost:0"),
        (["localhost:70000"], "70000"),
        (["::1:26379"], "IPv6"),
        (["[nothost]:1"], "IPv6"),
        ([("h", 1, 2)], "(host, port)"),
        (["a:1", "a:1"], "listed twice"),
        (12, "12"),
        ([("h", float("inf"))], "inf"),  # int() raised OverflowError (found by the fuzz test)
        ([("h", float("nan"))], "nan"),
    ],
)
def test_bad_sentinels(sentinels: object, fragment: str) -> None:
    with pytest.raises(ConfigurationError, match="sentinels") as info:
        PoolConfig.create(["m"], sentinels)
    assert fragment in str(info.value)


@pytest.mark.parametrize(
    ("masters", "fragment"),
    [
        ([], "at least one master"),
        (["a", "a"], "listed twice"),
        (["a", ""], "non-empty"),
        (["a", None], "non-empty"),
        (["a b"], "white space"),
        (5, "5"),
    ],
)
def test_bad_masters(masters: object, fragment: str) -> None:
    with pytest.raises(ConfigurationError, match="masters") as info:
        PoolConfig.create(masters, ["h:1"])
    assert fragment in str(info.value)


@pytest.mark.parametrize(
    ("weights", "fragment"),
    [
        ([1], "1 weights for 2 masters"),
        ([1, 0], "positive"),
        ([1, True], "positive"),
        ([1, 1.5], "positive"),
        ("11", "list"),
        ({"zz": 2}, "zz"),
        ([1, 10**6], "at most"),
    ],
)
def test_bad_weights(weights: object, fragment: str) -> None:
    with pytest.raises(ConfigurationError, match="weights") as info:
        PoolConfig.create(["a", "b"], ["h:1"], weights=weights)
    assert fragment in str(info.value)


def test_weights_by_name() -> None:
    config = PoolConfig.create(["a", "b"], ["h:1"], weights={"b": 3})
    assert config.weights == (1, 3)


def test_unknown_connection_option_suggests() -> None:
    with pytest.raises(ConfigurationError, match="socket_timeout"):
        PoolConfig.create(["a"], ["h:1"], socket_timout=1)


def test_bad_pool_option() -> None:
    with pytest.raises(ConfigurationError, match="max_connections"):
        PoolConfig.create(["a"], ["h:1"], max_connections=0)
    with pytest.raises(ConfigurationError, match="connection_kwargs.socket_timeout"):
        PoolConfig.create(["a"], ["h:1"], socket_timeout="fast")


def test_config_is_frozen_and_hashable_and_separates_sides() -> None:
    one = PoolConfig.create(["a"], ["h:1"], password="data", sentinel_kwargs={"password": "s"})
    two = PoolConfig.create(["a"], ("h:1",), password="data", sentinel_kwargs={"password": "s"})
    assert one == two and hash(one) == hash(two)
    assert one.connection_options()["password"] == "data"
    assert one.sentinel_options()["password"] == "s"
    assert "data" not in repr(one) and "'s'" not in repr(one)
    with pytest.raises(AttributeError):
        one.masters = ("b",)  # type: ignore[misc]


def test_adapter_options_unknown_name_suggests_nearest() -> None:
    with pytest.raises(ConfigurationError, match="did you mean 'MASTERS'"):
        parse_cache_config(["h:1"], {"MASTER": ["a"]})


def test_adapter_options_route_to_the_right_side() -> None:
    pool, cache = parse_cache_config(
        "h1:1,h2:2",
        {
            "MASTERS": ["a", "b"],
            "PASSWORD": "p",
            "SENTINEL_PASSWORD": "sp",
            "DB": 3,
            "MAX_CONNECTIONS": 7,
            "SERIALIZER": "json",
            "ignore_exceptions": True,
        },
    )
    assert pool.masters == ("a", "b")
    assert pool.connection_options()["db"] == 3
    assert pool.connection_options()["password"] == "p"
    assert pool.sentinel_options()["password"] == "sp"
    assert "db" not in pool.sentinel_options()
    assert pool.max_connections == 7
    assert cache.serializer == "json" and cache.ignore_exceptions is True


def test_masters_required() -> None:
    with pytest.raises(ConfigurationError, match="MASTERS is required"):
        parse_cache_config(["h:1"], {})


def test_url() -> None:
    sentinels, masters, options = parse_url(
        "sentinel://user:p%40ss@h1:26379,[::1]:26380/shard_a,shard_b?db=2&ssl=true"
    )
    assert sentinels == (Address("h1", 26379), Address("::1", 26380))
    assert masters == ("shard_a", "shard_b")
    assert options["USERNAME"] == "user" and options["PASSWORD"] == "p@ss"
    assert options["DB"] == 2 and options["SSL"] is True
    pool, _ = parse_cache_config("sentinel://h1:26379/a,b?max_connections=9", None)
    assert pool.masters == ("a", "b") and pool.max_connections == 9


def test_url_bad_scheme() -> None:
    with pytest.raises(ConfigurationError, match="LOCATION"):
        parse_cache_config("redis://h1:6379/0", {"MASTERS": ["a"]})


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"MAX_CONNECTIONS": 0}, "MAX_CONNECTIONS: must be an integer >= 1"),
        ({"SOCKET_TIMEOUT": "x"}, "SOCKET_TIMEOUT: must be a finite number"),
        ({"SENTINEL_SOCKET_TIMEOUT": -1}, "SENTINEL_SOCKET_TIMEOUT: must be a finite number"),
        ({"DB": "x"}, "DB: must be an integer >= 0"),
        ({"DB": -1}, "DB: must be an integer >= 0"),
        ({"PASSWORD": 5}, "PASSWORD: must be a string"),
        ({"SSL": "no"}, "SSL: must be True or False"),
        ({"SENTINEL_SSL": 1}, "SENTINEL_SSL: must be True or False"),
        ({"SSL_CA_CERTS": "/ca.pem"}, "SSL_CA_CERTS: is set but TLS is not enabled"),
        ({"CONNECTION_KWARGS": {"bogus": 1}}, "CONNECTION_KWARGS: unknown redis connection"),
        ({"db": 1, "DB": 2}, "DB is given twice"),
    ],
)
def test_adapter_errors_name_the_option_as_written(options: dict, message: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        parse_cache_config(["h:1"], {"MASTERS": ["a"], **options})
    assert message in str(info.value)


def test_url_and_options_may_not_both_set_a_value() -> None:
    with pytest.raises(ConfigurationError, match="MASTERS is given both"):
        parse_cache_config("sentinel://h:1/a,b", {"MASTERS": ["c"]})


def test_sentinels_scheme_means_tls_on_both_sides() -> None:
    pool, _ = parse_cache_config("sentinels://h:1/a", None)
    assert pool.connection_options()["ssl"] is True
    assert pool.sentinel_options()["ssl"] is True


def test_a_secret_in_a_misplaced_tls_option_is_not_echoed() -> None:
    with pytest.raises(ConfigurationError) as info:
        PoolConfig.create(["a"], "h:1", ssl_password="hunter2-secret")
    assert "hunter2" not in str(info.value) and "ssl_password" in str(info.value)


# -- the structured parts of an error ----------------------------------------------------------


def _error(location: object, options: dict | None) -> ConfigurationError:
    with pytest.raises(ConfigurationError) as info:
        parse_cache_config(location, options)
    error = info.value
    assert str(error) == f"{error.option}: {error.reason}"
    return error


def test_a_bad_number_names_option_value_and_reason() -> None:
    error = _error(["h:1"], {"MASTERS": ["a"], "socket_timeout": -1})
    assert (error.option, error.value) == ("SOCKET_TIMEOUT", -1)
    assert error.reason == "must be a finite number >= 0.001 (got -1)"
    # The core's constructor knows only its own, dotted name.
    with pytest.raises(ConfigurationError) as info:
        PoolConfig.create(["a"], "h:1", socket_timeout=-1)
    assert (info.value.option, info.value.value) == ("connection_kwargs.socket_timeout", -1)
    assert info.value.reason == error.reason


def test_an_unknown_option_is_an_error_of_the_options_mapping() -> None:
    error = _error(["h:1"], {"MASTERS": ["a"], "WIEGHTS": [1]})
    assert (error.option, error.value) == ("OPTIONS", "WIEGHTS")
    assert error.reason.startswith("unknown option 'WIEGHTS'; did you mean 'WEIGHTS'?")
    missing = _error(["h:1"], {})
    assert (missing.option, missing.value) == ("OPTIONS", None)


def test_a_bad_url_part_shows_the_url_with_its_secrets_masked() -> None:
    error = _error("sentinel://user:hunter2-secret@h:notaport/a", None)
    assert error.option == "LOCATION"
    assert error.value == "sentinel://***@h:notaport/a"
    assert "hunter2" not in repr(error.__dict__)
    query = _error("sentinel://h:1/a?max_connections=x", None)
    assert (query.option, query.value) == ("MAX_CONNECTIONS", "x")


def test_a_secret_value_is_masked_in_the_attribute_too() -> None:
    error = _error(["h:1"], {"MASTERS": ["a"], "SIGNING_KEY": "short-secret"})
    assert (error.option, error.value) == ("SIGNING_KEY", "***")


def test_the_attributes_survive_pickling() -> None:
    import pickle

    error = _error(["h:1"], {"MASTERS": ["a"], "MAX_CONNECTIONS": 0})
    copy = pickle.loads(pickle.dumps(error))
    assert str(copy) == str(error)
    assert (copy.option, copy.value, copy.reason) == (error.option, error.value, error.reason)


@pytest.mark.parametrize(
    ("option", "value", "keyword"),
    [
        ("SIGNING_KEY", "short", "signing_key"),
        ("SIGNING_KEY", 12345678901234567, "signing_key"),
        ("COMPRESS_MIN_LENGTH", -1, "compress_min_length"),
        ("COMPRESS_MIN_LENGTH", True, "compress_min_length"),
    ],
)
def test_codec_options_are_checked_by_the_codec_rule_only(
    option: str, value: object, keyword: str
) -> None:
    """The adapters' parser and a Codec built by hand apply the same check: same error."""
    from sentinel_cache.core.serializers import Codec

    error = _error(["h:1"], {"MASTERS": ["a"], option: value})
    with pytest.raises(ConfigurationError) as info:
        Codec(**{keyword: value})
    assert str(info.value) == str(error)
    assert (info.value.option, info.value.value) == (error.option, error.value)
