"""Redis's own removals become exactly one report per removed chunk: maxmemory evictions,
expiries, DELs by anyone; on every master of a cluster; again after the server restarts."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Sequence

import pytest

from kvstore.keys import BlockKey
from kvstore.namespace import namespace_id
from kvstore.remote import RemoteChunks, RemoteStore, RemovalWatcher
from kvstore.remote.removals import missing_flags
from tests.support.redis_servers import RedisClusterServers, RedisServer, redis_server

from .conftest import descriptor, key, make_config, payload

pytestmark = pytest.mark.redis

ROW = 4096


class Sink:
    def __init__(self) -> None:
        self.removed_keys: list[BlockKey] = []
        self.resubscribed_nodes: list[str] = []

    def removed(self, keys: Sequence[BlockKey]) -> None:
        self.removed_keys.extend(keys)

    def resubscribed(self, node: str) -> None:
        self.resubscribed_nodes.append(node)


async def settle(sink: Sink, expected: int, timeout_s: float = 5.0) -> None:
    """Until `expected` removals arrived, then a little longer to catch any extra."""
    deadline = time.monotonic() + timeout_s
    while len(sink.removed_keys) < expected and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    await asyncio.sleep(0.2)


def test_missing_flags() -> None:
    assert missing_flags("") == "Egxe"
    assert missing_flags("KEA") == ""
    assert missing_flags("xE") == "ge"
    assert missing_flags("Kg") == "Exe"


async def test_each_eviction_is_reported_exactly_once() -> None:
    with redis_server(maxmemory="4mb", maxmemory_policy="allkeys-lru") as srv:
        desc = descriptor(row_bytes=ROW)
        sink = Sink()
        async with RemoteStore(make_config(srv.url)) as store:
            chunks = RemoteChunks(store, desc)
            async with RemovalWatcher(store, chunks.namespace_id, sink) as watcher:
                assert watcher.subscribed_nodes == [srv.address]
                keys = [key(i) for i in range(2000)]  # ~8 MiB into 4 MiB
                for start in range(0, len(keys), 100):
                    batch = keys[start : start + 100]
                    stored = await chunks.store_many([(k, payload(0, ROW)) for k in batch])
                    assert all(stored)
                # Any command may evict while the server is over maxmemory (the notifications
                # queued for the subscriber count too): look until nothing changes any more.
                absent: set[BlockKey] = set()
                for _ in range(10):
                    present = await chunks.lookup(keys)
                    now_absent = {k for k, here in zip(keys, present, strict=True) if not here}
                    await settle(sink, len(now_absent))
                    if now_absent == absent:
                        break
                    absent = now_absent
                assert len(absent) > 500
                has_descriptor = await store.get_descriptor(chunks.namespace_id) is not None
        counts = Counter(sink.removed_keys)
        assert set(counts) == absent
        assert set(counts.values()) == {1}
        with srv.client() as client:
            evicted_keys = client.info("stats")["evicted_keys"]
        assert evicted_keys == len(absent) + (0 if has_descriptor else 1)


async def test_del_and_expiry_are_reported_once_each_and_other_keys_ignored(
    server: RedisServer,
) -> None:
    sink = Sink()
    async with RemoteStore(make_config(server.url)) as store:
        chunks = RemoteChunks(store, descriptor(row_bytes=ROW))
        other = RemoteChunks(store, descriptor("other-model", row_bytes=ROW))
        async with RemovalWatcher(store, chunks.namespace_id, sink):
            keys = [key(i) for i in range(4)]
            await chunks.store_many([(k, payload(i, ROW)) for i, k in enumerate(keys)])
            await other.store_many([(key(0), payload(0, ROW))])
            with server.client() as client:
                client.delete(chunks.redis_key(keys[0]))  # another instance's DEL
                client.unlink(chunks.redis_key(keys[1]))
                client.pexpire(chunks.redis_key(keys[2]), 1)
                client.delete(other.redis_key(key(0)))  # another namespace: not ours
                client.delete(b"unrelated")
            await chunks.remove([keys[3]])  # our own DEL is a removal too
            await settle(sink, 4)
    assert Counter(sink.removed_keys) == Counter(keys)


async def test_cluster_removals_from_every_master(shared_cluster: RedisClusterServers) -> None:
    sink = Sink()
    desc = descriptor("cluster-removals", row_bytes=ROW)
    async with RemoteStore(make_config(shared_cluster.url)) as store:
        chunks = RemoteChunks(store, desc)
        async with RemovalWatcher(store, namespace_id(desc), sink) as watcher:
            assert len(watcher.subscribed_nodes) == 3
            keys = [key(i) for i in range(30)]
            await chunks.store_many([(k, payload(i, ROW)) for i, k in enumerate(keys)])
            owners = {shared_cluster.node_for_key(chunks.redis_key(k)).address for k in keys}
            assert len(owners) == 3
            assert all(await chunks.remove(keys))
            await settle(sink, 30)
    assert Counter(sink.removed_keys) == Counter(keys)


async def test_resubscribes_after_a_restart(
    server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    sink = Sink()
    async with RemoteStore(make_config(server.url)) as store:
        chunks = RemoteChunks(store, descriptor(row_bytes=ROW))
        watcher = RemovalWatcher(store, chunks.namespace_id, sink, ping_interval_s=0.2)
        assert await watcher.start()
        with caplog.at_level(logging.WARNING, logger="kvstore.remote.removals"):
            server.restart()  # notifications are off again on the fresh server
            deadline = time.monotonic() + 10
            while not sink.resubscribed_nodes and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
        assert sink.resubscribed_nodes == [server.address]
        assert "subscription to" in caplog.text
        await chunks.store_many([(key(1), payload(1, ROW))])
        await chunks.remove([key(1)])
        await settle(sink, 1)
        assert sink.removed_keys == [key(1)]
        await watcher.close()
        assert watcher.subscribed_nodes == []


async def test_a_hung_server_is_noticed_by_the_ping(server: RedisServer) -> None:
    sink = Sink()
    async with RemoteStore(make_config(server.url)) as store:
        watcher = RemovalWatcher(store, "00112233445566ff", sink, ping_interval_s=0.2)
        assert await watcher.start()
        with server.paused():
            deadline = time.monotonic() + 5
            while watcher.subscribed_nodes and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            assert watcher.subscribed_nodes == []
        assert await watcher.start(timeout_s=10)
        await watcher.close()


async def test_config_refused_warns_once_and_uses_the_servers_setting(
    caplog: pytest.LogCaptureFixture,
) -> None:
    args = ["--rename-command", "CONFIG", "", "--notify-keyspace-events", "KEA"]
    with redis_server(extra_args=args) as srv:
        sink = Sink()
        async with RemoteStore(make_config(srv.url)) as store:
            chunks = RemoteChunks(store, namespace="00112233445566ff")
            with caplog.at_level(logging.WARNING, logger="kvstore.remote.removals"):
                async with RemovalWatcher(store, chunks.namespace_id, sink):
                    await chunks.store_many([(key(1), payload(1, ROW))])
                    await chunks.remove([key(1)])
                    await settle(sink, 1)
    assert sink.removed_keys == [key(1)]
    warnings = [r for r in caplog.records if "notify-keyspace-events" in r.getMessage()]
    assert len(warnings) == 1
