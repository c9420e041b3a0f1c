"""remote_* keys: parsing, defaults, errors that name the key and never hold a password."""

from __future__ import annotations

import pytest

from kvstore.errors import ConfigError
from kvstore.remote import REMOTE_CONFIG_DEFAULTS, RemoteConfig, parse_remote_url
from kvstore.remote.errors import RemoteConfigError

SECRET = "s3cr3t-hunter2"


def test_no_url_means_no_remote_tier() -> None:
    assert RemoteConfig.from_values({}) is None
    assert RemoteConfig.from_values({"cpu_bytes": 1, "remote_url": None}) is None


def test_defaults() -> None:
    config = RemoteConfig.from_values({"remote_url": "redis://127.0.0.1:6379/0"})
    assert config is not None
    assert config.timeout_ms == REMOTE_CONFIG_DEFAULTS["remote_timeout_ms"] == 500
    assert config.timeout_s == 0.5
    assert config.queue_chunks == 256
    assert config.enable_write is True
    assert config.password_env is None
    assert config.password() is None


def test_values_are_parsed() -> None:
    config = RemoteConfig.from_values(
        {
            "remote_url": "redis://10.0.0.1:7000/3",
            "remote_timeout_ms": "250",
            "remote_queue_chunks": 64,
            "remote_write": "false",
        }
    )
    assert config is not None
    assert config.endpoint.hosts == (("10.0.0.1", 7000),)
    assert config.endpoint.db == 3
    assert (config.timeout_ms, config.queue_chunks, config.enable_write) == (250, 64, False)


@pytest.mark.parametrize(
    ("values", "key", "fragment"),
    [
        ({"remote_timeout_ms": 0}, "remote_timeout_ms", ">= 1"),
        ({"remote_timeout_ms": "soon"}, "remote_timeout_ms", "'soon'"),
        ({"remote_timeout_ms": True}, "remote_timeout_ms", "True"),
        ({"remote_queue_chunks": -1}, "remote_queue_chunks", ">= 1"),
        ({"remote_write": "maybe"}, "remote_write", "'maybe'"),
        ({"remote_url": 6379}, "remote_url", "6379"),
        ({"remote_url": "http://x:1"}, "remote_url", "'http'"),
        ({"remote_url": "redis://x:99999"}, "remote_url", "99999"),
        ({"remote_url": "redis://x:port"}, "remote_url", "'port'"),
        ({"remote_url": "redis://x:1/db"}, "remote_url", "'db'"),
        ({"remote_url": "redis://a:1,b:2/1"}, "remote_url", "database 0"),
        ({"remote_url": "redis://x:1?foo=1"}, "remote_url", "'foo'"),
        ({"remote_url": "unix://relative.sock"}, "remote_url", "absolute"),
        ({"remote_url": ""}, "remote_url", "empty"),
        ({"remote_flavour": "x"}, "remote_flavour", "allowed"),
        ({"remote_password_env": "has space"}, "remote_password_env", "NAME"),
        ({"remote_password_env": "NOT_SET_ANYWHERE_XYZ"}, "remote_password_env", "not set"),
    ],
)
def test_bad_values_name_the_key(values: dict[str, object], key: str, fragment: str) -> None:
    merged = {"remote_url": "redis://127.0.0.1:6379", **values}
    with pytest.raises(ConfigError, match=key) as info:
        RemoteConfig.from_values(merged)
    assert fragment in str(info.value)
    assert isinstance(info.value, RemoteConfigError)


def test_password_env_without_url_is_an_error() -> None:
    with pytest.raises(ConfigError, match="remote_password_env: is set but remote_url is not"):
        RemoteConfig.from_values({"remote_password_env": "X"})


def test_a_password_in_the_url_is_refused_without_echoing_it() -> None:
    for url in (f"redis://:{SECRET}@h:6379/0", f"redis://user:{SECRET}@h:6379"):
        with pytest.raises(ConfigError, match="remote_password_env") as info:
            RemoteConfig.from_values({"remote_url": url})
        assert SECRET not in str(info.value)


def test_a_password_in_the_env_name_key_is_not_echoed() -> None:
    with pytest.raises(ConfigError, match="remote_password_env") as info:
        RemoteConfig.from_values({"remote_url": "redis://h", "remote_password_env": SECRET})
    assert SECRET not in str(info.value)


def test_the_password_is_read_from_the_environment_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KV_TEST_REDIS_PASSWORD", SECRET)
    config = RemoteConfig.from_values(
        {"remote_url": "redis://h:1", "remote_password_env": "KV_TEST_REDIS_PASSWORD"}
    )
    assert config is not None
    assert config.password() == SECRET
    assert SECRET not in repr(config)
    monkeypatch.delenv("KV_TEST_REDIS_PASSWORD")
    with pytest.raises(ConfigError, match="KV_TEST_REDIS_PASSWORD is not set"):
        config.password()


@pytest.mark.parametrize(
    ("url", "hosts", "db", "tls", "cluster"),
    [
        ("redis://127.0.0.1:6379/0", (("127.0.0.1", 6379),), 0, False, False),
        ("redis://cache", (("cache", 6379),), 0, False, False),
        ("redis://cache:7000?db=2", (("cache", 7000),), 2, False, False),
        ("rediss://cache:6380/1", (("cache", 6380),), 1, True, False),
        ("a:7000,b:7001", (("a", 7000), ("b", 7001)), 0, False, True),
        ("a:7000, b:7001 ,c", (("a", 7000), ("b", 7001), ("c", 6379)), 0, False, True),
        ("rediss://a:7000,b:7001", (("a", 7000), ("b", 7001)), 0, True, True),
        ("redis://[::1]:7000/0", (("::1", 7000),), 0, False, False),
    ],
)
def test_url_forms(
    url: str, hosts: tuple[tuple[str, int], ...], db: int, tls: bool, cluster: bool
) -> None:
    endpoint = parse_remote_url(url)
    assert (endpoint.hosts, endpoint.db, endpoint.tls, endpoint.is_seed_list) == (
        hosts,
        db,
        tls,
        cluster,
    )


def test_unix_url_and_user_and_tls_options() -> None:
    endpoint = parse_remote_url("unix:///run/redis/redis.sock?db=4")
    assert (endpoint.unix_path, endpoint.db, endpoint.hosts) == ("/run/redis/redis.sock", 4, ())
    assert endpoint.display() == "unix:///run/redis/redis.sock?db=4"
    endpoint = parse_remote_url("rediss://kv@cache:6380/0?ssl_cert_reqs=none&ssl_ca_certs=/ca.pem")
    assert endpoint.username == "kv"
    assert dict(endpoint.tls_options) == {"ssl_cert_reqs": "none", "ssl_ca_certs": "/ca.pem"}
    assert endpoint.display() == "rediss://kv@cache:6380/0"
    with pytest.raises(ConfigError, match="ssl_cert_reqs"):
        parse_remote_url("rediss://cache?ssl_cert_reqs=sometimes")
    with pytest.raises(ConfigError, match="'ssl_ca_certs'"):
        parse_remote_url("redis://cache?ssl_ca_certs=/ca.pem")  # TLS options need rediss://
