"""Hostile input, fuzzed: configuration values and sentinel events from hypothesis.

The companion of tests/test_hostile.py (odd keys, unreadable values, lying sentinels, forged
events): whatever a setting holds, parsing returns or raises ConfigurationError with a message;
whatever an event holds, its parsers raise only ValueError and the listener never raises.
"""

from __future__ import annotations

import contextlib
import math
import string
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sentinel_cache import ConfigurationError
from sentinel_cache.core.config import (
    CONNECTION_PARAMETERS,
    OPTION_NAMES,
    Address,
    PoolConfig,
    parse_cache_config,
    parse_sentinels,
    parse_url,
)
from sentinel_cache.core.topology.listener import (
    CHANNELS,
    SentinelListener,
    parse_instance_event,
    parse_switch,
)
from sentinel_cache.core.topology.sharded_pool import ShardedSentinelPool

FUZZ = settings(
    max_examples=300,
    deadline=None,
    database=None,  # write nothing into the working tree
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)


# ----------------------------------------------------------------------------- config fuzzing


def _fails_cleanly(parse: Callable[[], Any]) -> Any:
    """Run a parser: it returns, or raises ConfigurationError; anything else fails the test."""
    try:
        return parse()
    except ConfigurationError as exc:
        assert str(exc)
        return None


junk = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    st.binary(max_size=8),
    st.binary(max_size=4).map(bytearray),
    st.sets(st.integers(0, 9), max_size=2),
    st.lists(st.integers(), max_size=3),
    st.dictionaries(st.text(max_size=4), st.integers(), max_size=2),
    st.builds(object),
)
names = st.text(alphabet=string.ascii_letters + string.digits + "_-.:@", min_size=1, max_size=8)
hosts = st.one_of(
    st.sampled_from(["127.0.0.1", "localhost", "::1", "[::1]", "[nothost]", "", " ", "h:1"]),
    st.text(max_size=10),
)
ports = st.one_of(st.integers(-2, 70000), st.text(max_size=6), junk)
addresses = st.one_of(
    st.builds(lambda h, p: f"{h}:{p}", hosts, ports),
    st.tuples(hosts, ports),
    st.lists(st.one_of(hosts, ports), max_size=3),
    junk,
)
sentinel_values = st.one_of(
    st.lists(addresses, max_size=4),
    st.lists(addresses, max_size=4).map(lambda xs: ",".join(map(str, xs))),
    addresses,
)
pool_fields = [
    "max_connections",
    "pool_timeout",
    "health_check_interval",
    "read_from_replicas",
    "discovery_timeout",
    "failover_hold",
    "listeners",
    "reresolve_interval",
]
kwarg_names = st.one_of(
    st.sampled_from(sorted(CONNECTION_PARAMETERS) + pool_fields),
    st.text(max_size=8).filter(lambda k: k not in ("masters", "sentinels", "weights")),
)
kwarg_values = st.one_of(junk, st.integers(0, 100), st.floats(0, 10), st.text(max_size=8))


@FUZZ
@given(value=sentinel_values)
def test_fuzz_parse_sentinels(value: Any) -> None:
    parsed = _fails_cleanly(lambda: parse_sentinels(value))
    if parsed is not None:
        assert parsed and all(1 <= a.port <= 65535 and a.host for a in parsed)
        assert len(set(parsed)) == len(parsed)


@FUZZ
@given(
    masters=st.one_of(st.lists(names, max_size=4), names, junk),
    sentinels=st.one_of(st.just(["127.0.0.1:26379"]), sentinel_values),
    weights=st.one_of(st.none(), st.lists(st.integers(-1, 1001), max_size=4), junk),
    kwargs=st.dictionaries(kwarg_names, kwarg_values, max_size=4),
    sentinel_kwargs=st.one_of(st.none(), st.dictionaries(kwarg_names, kwarg_values, max_size=3)),
)
def test_fuzz_pool_config_create(
    masters: Any, sentinels: Any, weights: Any, kwargs: Any, sentinel_kwargs: Any
) -> None:
    config = _fails_cleanly(
        lambda: PoolConfig.create(
            masters, sentinels, weights=weights, sentinel_kwargs=sentinel_kwargs, **kwargs
        )
    )
    if config is not None:
        hash(config)  # it keys the process-wide registry
        assert repr(config)
        assert (
            PoolConfig.create(
                config.masters,
                config.sentinels,
                weights=config.weights,
                sentinel_kwargs=config.sentinel_options(),
                **config.connection_options(),
            ).masters
            == config.masters
        )


option_names = st.one_of(
    st.sampled_from(sorted(OPTION_NAMES)),
    st.sampled_from(sorted(OPTION_NAMES)).map(str.lower),
    st.text(max_size=10),
    st.integers(),
)
urls = st.builds(
    lambda scheme, userinfo, hosts, path, query: f"{scheme}://{userinfo}{hosts}{path}{query}",
    st.sampled_from(["sentinel", "sentinels", "redis", "SENTINEL", ""]),
    st.sampled_from(["", "user:pw@", ":pw@", "user@", "u:p/w@", "u:p?w@", "@", "a@b@"]),
    st.lists(st.builds(lambda h, p: f"{h}:{p}", hosts, ports), max_size=3).map(",".join),
    st.one_of(st.just(""), st.text(max_size=10).map(lambda t: "/" + t)),
    st.one_of(
        st.just(""),
        st.lists(
            st.builds(lambda n, v: f"{n}={v}", option_names.map(str), st.text(max_size=6)),
            max_size=3,
        ).map(lambda items: "?" + "&".join(items)),
    ),
)


@FUZZ
@given(
    location=st.one_of(sentinel_values, urls, st.text(max_size=30)),
    options=st.one_of(
        st.none(),
        junk,
        st.dictionaries(option_names, st.one_of(kwarg_values, st.lists(names)), max_size=5),
        st.dictionaries(option_names, kwarg_values, max_size=5).map(
            lambda o: {**o, "MASTERS": ["a", "b"]}
        ),
    ),
)
def test_fuzz_parse_cache_config(location: Any, options: Any) -> None:
    if options is not None and not hasattr(options, "items"):
        options = {"MASTERS": options}
    parsed = _fails_cleanly(lambda: parse_cache_config(location, options))
    if parsed is not None:
        config, cache_options = parsed
        hash(config)
        assert repr(config) and repr(cache_options)


@FUZZ
@given(url=st.one_of(urls, st.text(max_size=40)))
def test_fuzz_parse_url(url: str) -> None:
    parsed = _fails_cleanly(lambda: parse_url(url))
    if parsed is not None:
        sentinels, masters, options = parsed
        assert sentinels and isinstance(options, dict)


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("pool_timeout", math.nan),
        ("pool_timeout", math.inf),
        ("failover_hold", -math.inf),
        ("discovery_timeout", math.nan),
        ("socket_timeout", math.nan),
        ("socket_connect_timeout", math.inf),
        # redis-py's blocking pool fills a queue with max_connections placeholders up front.
        ("max_connections", 2**64),
        ("max_connections", 10**7),
    ],
)
def test_non_finite_or_absurd_numbers_are_rejected(name: str, value: float) -> None:
    with pytest.raises(ConfigurationError, match=name):
        PoolConfig.create(["a"], "h:1", **{name: value})
    with pytest.raises(ConfigurationError, match="SOCKET_TIMEOUT|finite"):
        parse_cache_config("h:1", {"MASTERS": ["a"], "SENTINEL_SOCKET_TIMEOUT": math.nan})
    with pytest.raises(ConfigurationError, match="LOG_IGNORED_EXCEPTIONS_INTERVAL"):
        parse_cache_config("h:1", {"MASTERS": ["a"], "LOG_IGNORED_EXCEPTIONS_INTERVAL": math.inf})


def test_unhashable_connection_options_are_configuration_errors() -> None:
    with pytest.raises(ConfigurationError, match=r"connection_kwargs\.ssl_ca_certs.*set"):
        PoolConfig.create(["a"], "h:1", ssl_ca_certs={"x"})
    with pytest.raises(ConfigurationError, match=r"sentinel_kwargs\.password: must be a string"):
        PoolConfig.create(["a"], "h:1", sentinel_kwargs={"password": bytearray(b"secret-pw")})


# ----------------------------------------------------------------------------- event fuzzing


@pytest.fixture(scope="module")
def offline_pool() -> Iterator[ShardedSentinelPool]:
    """A pool that never connects (its sentinel is port 1); switches are recorded, not made."""
    pool = ShardedSentinelPool(["alpha", "beta"], "127.0.0.1:1", listeners=False)
    switches: list[tuple[str, Address]] = []
    pool.switches = switches  # type: ignore[attr-defined]
    pool.on_switch_announced = (  # type: ignore[method-assign]
        lambda shard, address, **_: switches.append((shard.name, address))
    )
    yield pool
    pool.close()


event_text = st.one_of(
    st.text(max_size=60),
    st.builds(
        lambda parts: " ".join(parts),
        st.lists(
            st.one_of(
                st.sampled_from(["alpha", "beta", "master", "slave", "sentinel", "@", "x"]),
                st.integers(-5, 70000).map(str),
                hosts,
                st.text(alphabet=string.printable, max_size=6),
            ),
            max_size=9,
        ),
    ),
)


@FUZZ
@given(
    channel=st.one_of(st.sampled_from(CHANNELS), st.text(max_size=20), st.binary(max_size=20)),
    data=st.one_of(event_text, event_text.map(str.encode), st.binary(max_size=60), junk),
)
def test_fuzz_listener_handle_never_raises(
    offline_pool: ShardedSentinelPool, channel: Any, data: Any
) -> None:
    listener = SentinelListener(offline_pool, Address("127.0.0.1", 1), {})
    encoded = channel.encode() if isinstance(channel, str) and channel in CHANNELS else channel
    listener.handle(encoded, data)  # must not raise, whatever arrives
    for name, address in offline_pool.switches:  # type: ignore[attr-defined]
        assert name in ("alpha", "beta") and 1 <= address.port <= 65535
    for shard in offline_pool.shards:
        shard.lower_fence()


@FUZZ
@given(data=st.one_of(event_text, st.text(max_size=80)))
def test_fuzz_event_parsers_raise_only_value_error(data: str) -> None:
    for parse in (parse_switch, parse_instance_event):
        with contextlib.suppress(ValueError):
            parse(data)
