"""A dead, hung, killed or password-protected Redis: calls stay within the timeout, misses are
misses, the breaker opens and closes again, errors name the key and never the password."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from kvstore.errors import ConfigError
from kvstore.remote import BreakerState, RemoteAuthError, RemoteStore
from tests.support.net import free_port
from tests.support.redis_servers import RedisClusterServers, RedisServer, redis_server

from .conftest import TIMEOUT_MS, make_config

pytestmark = pytest.mark.redis

BUDGET_S = TIMEOUT_MS / 1000 + 0.5  # the timeout plus scheduling slack on a busy 2-core box
PASSWORD = "correct-horse-battery-staple"


async def timed(call: Awaitable[Any]) -> tuple[Any, float]:
    started = time.monotonic()
    result = await call
    return result, time.monotonic() - started


async def wait_until(predicate: Callable[[], Awaitable[bool]], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not await predicate():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.05)


async def test_dead_server_at_connect_is_a_warning_and_misses(
    caplog: pytest.LogCaptureFixture,
) -> None:
    port = free_port()  # nothing listens there
    store = RemoteStore(make_config(f"redis://127.0.0.1:{port}/0"))
    with caplog.at_level(logging.WARNING, logger="kvstore.remote"):
        connected, elapsed = await timed(store.connect())
    assert connected is False and elapsed < BUDGET_S
    assert "unreachable at start" in caplog.text
    assert store.breaker_states() == {f"127.0.0.1:{port}": BreakerState.OPEN}
    for call in (
        store.exists_many([b"a", b"b"]),
        store.get_many([b"a"]),
        store.put_many([(b"a", b"1")]),
        store.delete_many([b"a"]),
    ):
        result, elapsed = await timed(call)
        assert elapsed < 0.1  # the breaker is open: no I/O at all
        assert not any(result)
    await store.close()


async def test_a_server_that_comes_up_later_is_used_after_the_backoff() -> None:
    with redis_server() as srv:
        srv.kill()
        store = RemoteStore(make_config(srv.url))
        assert await store.connect() is False
        srv.start()

        async def works() -> bool:
            return await store.put_many([(b"k", b"v")]) == [True]

        await wait_until(works)
        assert store.breaker_states()[srv.address] is BreakerState.CLOSED
        assert await store.get_many([b"k"]) == [b"v"]
        await store.close()


async def test_a_hung_server_costs_at_most_the_timeout(server: RedisServer) -> None:
    async with RemoteStore(make_config(server.url)) as store:
        await store.put_many([(b"k", b"v")])
        with server.paused():
            for call in (
                store.get_many([b"k"]),
                store.exists_many([b"k"]),
                store.put_many([(b"k2", b"v")]),
                store.get_many([b"k"]),
                store.get_many([b"k"]),
            ):
                result, elapsed = await timed(call)
                assert elapsed < BUDGET_S
                assert not any(result)
            assert store.breaker_states()[server.address] is BreakerState.OPEN
            _, elapsed = await timed(store.get_many([b"k"]))
            assert elapsed < 0.1
        # resumed: after the backoff a probe succeeds and the breaker closes

        async def served() -> bool:
            return await store.get_many([b"k"]) == [b"v"]

        await wait_until(served)
        assert store.breaker_states()[server.address] is BreakerState.CLOSED


async def test_many_concurrent_calls_to_a_hung_server_stay_within_the_timeout(
    server: RedisServer,
) -> None:
    async with RemoteStore(make_config(server.url)) as store:
        with server.paused():
            started = time.monotonic()
            results = await asyncio.gather(*(store.get_many([b"%d" % i]) for i in range(50)))
            assert time.monotonic() - started < BUDGET_S
            assert results == [[None]] * 50


async def test_killed_and_restarted_server_closes_the_breaker_again(
    server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    async with RemoteStore(make_config(server.url)) as store:
        assert await store.put_many([(b"k", b"v")]) == [True]
        server.kill()
        with caplog.at_level(logging.INFO, logger="kvstore.remote.breaker"):
            for _ in range(3):
                result, elapsed = await timed(store.get_many([b"k"]))
                assert result == [None] and elapsed < BUDGET_S
            assert store.breaker_states()[server.address] is BreakerState.OPEN
            server.start()  # same port, empty

            async def writable() -> bool:
                return await store.put_many([(b"k", b"new")]) == [True]

            await wait_until(writable)
        assert store.breaker_states()[server.address] is BreakerState.CLOSED
        assert await store.get_many([b"k"]) == [b"new"]
        messages = [r.getMessage() for r in caplog.records if r.levelno >= logging.INFO]
        assert sum("OPEN" in m for m in messages) == 1
        assert sum("CLOSED" in m for m in messages) == 1


async def test_killed_cluster_master_costs_only_its_slots(cluster: RedisClusterServers) -> None:
    async with RemoteStore(make_config(cluster.url)) as store:
        keys = [b"key:%d" % i for i in range(60)]
        assert await store.put_many([(k, k) for k in keys]) == [True] * 60
        victim = cluster.node_for_key(keys[0])
        lost = {k for k in keys if cluster.node_for_key(k) is victim}
        victim.kill()
        for _ in range(4):
            values, elapsed = await timed(store.get_many(keys))
            assert elapsed < BUDGET_S
            assert values == [None if k in lost else k for k in keys]
        states = store.breaker_states()
        assert states[victim.address] is BreakerState.OPEN
        assert sum(s is BreakerState.CLOSED for s in states.values()) == 2
        _, elapsed = await timed(store.get_many(keys))
        assert elapsed < 0.1  # the dead master is skipped at once, the others answer
        others = [k for k in keys if k not in lost]
        assert await store.put_many([(k, b"x") for k in others]) == [True] * len(others)

        victim.start()
        cluster.wait_until_ok()

        async def all_served() -> bool:
            return all(await store.put_many([(k, k) for k in keys]))

        await wait_until(all_served)
        assert set(store.breaker_states().values()) == {BreakerState.CLOSED}


async def test_hung_cluster_master_does_not_delay_the_others(
    cluster: RedisClusterServers,
) -> None:
    async with RemoteStore(make_config(cluster.url)) as store:
        keys = [b"key:%d" % i for i in range(60)]
        await store.put_many([(k, k) for k in keys])
        victim = cluster.node_for_key(keys[0])
        lost = {k for k in keys if cluster.node_for_key(k) is victim}
        with victim.paused():
            for _ in range(3):
                values, elapsed = await timed(store.get_many(keys))
                assert elapsed < BUDGET_S
                assert values == [None if k in lost else k for k in keys]
            _, elapsed = await timed(store.exists_many(keys))
            assert elapsed < 0.1


async def test_wrong_password_names_the_key_never_the_password(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    wrong = "wrong-password-123"
    monkeypatch.setenv("KV_TEST_REDIS_PASSWORD", wrong)
    with redis_server(password=PASSWORD) as srv:
        config = make_config(srv.url, remote_password_env="KV_TEST_REDIS_PASSWORD")
        store = RemoteStore(config)
        with pytest.raises(RemoteAuthError) as info:
            await store.connect()
        await store.close()
        message = str(info.value)
        assert isinstance(info.value, ConfigError)
        assert message.startswith("remote_password_env:")
        assert "KV_TEST_REDIS_PASSWORD" in message
        assert wrong not in message and PASSWORD not in message
        assert wrong not in repr(store.config)

        no_password = RemoteStore(make_config(srv.url))
        with pytest.raises(RemoteAuthError, match="requires a password") as info:
            await no_password.connect()
        await no_password.close()

        monkeypatch.setenv("KV_TEST_REDIS_PASSWORD", PASSWORD)
        async with RemoteStore(config) as good:
            assert await good.put_many([(b"k", b"v")]) == [True]


async def test_cluster_with_a_password(monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.support.redis_servers import redis_cluster

    monkeypatch.setenv("KV_TEST_REDIS_PASSWORD", PASSWORD)
    with redis_cluster(password=PASSWORD) as cluster:
        config = make_config(cluster.url, remote_password_env="KV_TEST_REDIS_PASSWORD")
        async with RemoteStore(config) as store:
            assert store.is_cluster
            keys = [b"p:%d" % i for i in range(30)]
            assert await store.put_many([(k, k) for k in keys]) == [True] * 30
            assert await store.get_many(keys) == keys
