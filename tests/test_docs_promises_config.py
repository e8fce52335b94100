"""The error messages docs/configuration.md quotes for rejected settings are the code's.

Every message quoted in a "Rejected when" cell of the option tables, and in the "Rejected:"
paragraph about ``LOCATION``, has a setting here that provokes it; the test fails if the page
quotes a message no case provokes (a new quote, or one reworded), or if the code's message no
longer contains the page's words. A quote ending in ``...`` is the start of the message.
Settings are refused before anything connects, so no server is needed.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from sentinel_cache import ConfigurationError
from sentinel_cache.core.config import parse_cache_config
from sentinel_cache.core.serializers import build_codec
from sentinel_cache.core.topology.sharded_pool import ShardedSentinelPool

PAGE = Path(__file__).resolve().parent.parent / "docs" / "configuration.md"
SENTINELS = ["10.0.0.1:26379"]


def quoted_rejections() -> list[str]:
    """The messages the page quotes for refused settings, white space folded."""
    text = PAGE.read_text(encoding="utf-8")
    section = text[text.index("\n## The sentinels") : text.index("\n## Adopting")]
    cells = [
        line.rsplit(" | ", 1)[1]
        for line in section.splitlines()
        if re.match(r"^\| `[A-Z]", line)  # an option's row: its last cell is "Rejected when"
    ]
    paragraph = re.search(r"\nRejected:(.*?)\n\n", section, re.S)
    assert paragraph is not None, "the LOCATION section lost its 'Rejected:' paragraph"
    quotes = re.findall(r"\(`([A-Za-z0-9][^`]*)`", " ".join(cells) + paragraph[1])
    folded = [" ".join(quote.split()) for quote in quotes]
    # A command named in passing (`ROLE`, `SENTINEL SENTINELS`) is not a message.
    return [quote for quote in folded if not re.fullmatch(r"[A-Z ]+", quote)]


def options(**given: Any) -> Callable[[], object]:
    """Django's OPTIONS (upper case), parsed and made into a codec as the backends do."""

    def run() -> object:
        _, cache = parse_cache_config(SENTINELS, {"MASTERS": ["shard_a"], **given})
        return build_codec(cache)

    return run


def core(*, masters: Any = ("shard_a", "shard_b"), **kwargs: Any) -> Callable[[], object]:
    """The core's keyword arguments (lower case): the message names the core's field."""

    def run() -> object:
        ShardedSentinelPool(list(masters), SENTINELS, **kwargs).close()
        return None

    return run


def location(sentinels: Any) -> Callable[[], object]:
    return lambda: parse_cache_config(sentinels, {"MASTERS": ["shard_a"]})


# The page's quote -> a setting that must be refused with a message containing it.
CASES: dict[str, Callable[[], object]] = {
    "OPTIONS: MASTERS is required": lambda: parse_cache_config(SENTINELS, {}),
    "every weight must be at most 1000": core(weights=[1, 1001]),
    "3 weights for 2 masters; they must match": core(weights=[1, 2, 3]),
    "connection_kwargs.socket_timeout: must be a finite number >= 0.001 (got 0)": core(
        socket_timeout=0
    ),
    "connection_kwargs.socket_connect_timeout: ...": core(socket_connect_timeout=0),
    "CONNECTION_KWARGS: must be a dict of redis-py connection options": options(
        CONNECTION_KWARGS=["client_name", "web"]
    ),
    "connection_kwargs: unknown redis connection option; did you mean 'socket_timeout'?": core(
        socket_timout=1.0
    ),
    "sentinel_kwargs.socket_timeout: ...": core(sentinel_kwargs={"socket_timeout": 0}),
    "sentinel_kwargs.socket_connect_timeout: ...": core(
        sentinel_kwargs={"socket_connect_timeout": 0}
    ),
    "sentinel_kwargs: unknown redis connection option": core(sentinel_kwargs={"bogus": 1}),
    "max_connections: must be an integer >= 1": core(max_connections=0),
    "max_connections: must be at most 10000 (per shard and process)": core(max_connections=10_001),
    "pool_timeout: must be a finite number >= 0": core(pool_timeout=-1),
    "read_from_replicas: must be True or False": core(read_from_replicas=1),
    "async_multiplex: must be True or False": core(async_multiplex="yes"),
    'near_cache_push: must be "auto", True (RESP3 push only) or False (the RESP2 redirect)': core(
        near_cache_push="yes"
    ),
    "outage_hold: must be a finite number >= 0": core(outage_hold=-0.5),
    "outage_reads_max_lag: must be a finite number >= 0.001": core(outage_reads_max_lag=0),
    'SERIALIZER: expected "pickle", "json", "msgpack", "text", "bytes" or a dotted path': options(
        SERIALIZER=42
    ),
    "SERIALIZER: cannot import it: ...": options(SERIALIZER="no_such_module_here.Serializer"),
    'VALUE_FORMAT: expected "framed" or "plain"': options(VALUE_FORMAT="raw"),
    'COMPRESSOR: expected "zlib", "zstd" or a dotted path': options(COMPRESSOR="lz4-typo"),
    "SIGNING_KEY: must be a str or bytes of at least 16 characters (got '***')": options(
        SIGNING_KEY="too-short"
    ),
    "at least one sentinel address is required": location([]),
    "sentinel 10.0.0.1:26379 is listed twice": location(["10.0.0.1:26379", "10.0.0.1:26379"]),
    'expected "host:port"': location(["10.0.0.1"]),
    "the port must be an integer from 1 to 65535": location(["10.0.0.1:65536"]),
    'a URL must use the "sentinel://" scheme': location("redis://10.0.0.1:6379/shard_a"),
}


def test_every_quoted_rejection_has_a_case() -> None:
    quoted = quoted_rejections()
    assert len(quoted) >= 20, quoted  # the parsing still finds the page's quotes
    assert sorted(set(quoted) - set(CASES)) == [], "quoted on the page, provoked by no case"
    assert sorted(set(CASES) - set(quoted)) == [], "a case for a quote the page no longer has"


@pytest.mark.parametrize("quote", sorted(CASES))
def test_the_code_refuses_with_the_quoted_message(quote: str) -> None:
    with pytest.raises(ConfigurationError) as raised:
        CASES[quote]()
    message = str(raised.value)
    if quote.endswith("..."):
        assert message.startswith(quote[:-3].rstrip()), message
    else:
        assert quote in message, message
    # The message starts with the setting it names (the page's promise for every error).
    assert message.startswith(f"{raised.value.option}: "), message


@pytest.mark.parametrize(
    ("word", "value"),
    [("true", True), ("yes", True), ("on", True), ("false", False), ("no", False), ("off", False)],
)
def test_url_query_words_are_booleans(word: str, value: bool) -> None:
    """The page: query parameters are option names (case-insensitive; true/false/yes/no/on/off
    and numbers are converted); the path holds MASTERS, the credentials are the data nodes'."""
    pool, _ = parse_cache_config(
        f"sentinel://app:pw@10.0.0.1:26379/shard_a,shard_b?Read_From_Replicas={word.upper()}"
        f"&socket_timeout=1.5&MAX_CONNECTIONS=7",
        {},
    )
    assert pool.read_from_replicas is value
    assert pool.masters == ("shard_a", "shard_b") and pool.max_connections == 7
    data = pool.connection_options()
    assert data["socket_timeout"] == 1.5
    assert (data["username"], data["password"]) == ("app", "pw")
    assert "password" not in pool.sentinel_options()


@pytest.mark.parametrize(
    ("given", "connect"),
    [
        ({}, 2.0),  # the default
        ({"SOCKET_TIMEOUT": 0.5}, 0.5),  # only SOCKET_TIMEOUT, smaller: used for connecting too
        ({"SOCKET_TIMEOUT": 10}, 2.0),  # larger: the default stays
        ({"SOCKET_TIMEOUT": 0.5, "SOCKET_CONNECT_TIMEOUT": 3}, 3),  # both given: as given
    ],
)
def test_the_connect_timeout_follows_a_smaller_socket_timeout(
    given: dict[str, Any], connect: float
) -> None:
    """The page's SOCKET_CONNECT_TIMEOUT row (and operations.md: "defaults to the smaller of 2 s
    and SOCKET_TIMEOUT"): a black-holed master never holds a new connection longer than an
    established one."""
    pool, _ = parse_cache_config(SENTINELS, {"MASTERS": ["shard_a"], **given})
    assert pool.connection_options()["socket_connect_timeout"] == connect
