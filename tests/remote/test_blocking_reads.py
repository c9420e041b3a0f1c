"""Large values (KV chunks, >= 64 KiB) are read on blocking sockets in worker threads
(`kvstore.remote._blocking`): the same answers, deadlines, breakers and stats as the asyncio
path, on real servers: verified copies into rows, corrupt values rejected and deleted, a hung
or killed node costing at most the timeout and only its own keys, a read cancelled or a store
closed under it never writing a row afterwards."""

from __future__ import annotations

import asyncio
import time

import pytest

from kvstore.keys import BlockKey
from kvstore.remote import BreakerState, RemoteChunks, RemoteStore, codec
from kvstore.remote._blocking import BLOCKING_MIN_BYTES, READ_PIPELINE_BYTES, STRIPES
from tests.support.redis_servers import RedisClusterServers, RedisServer

from .conftest import TIMEOUT_MS, descriptor, key, make_config, payload

pytestmark = pytest.mark.redis

ROW = 256 << 10  # a chunk of a small model: well above BLOCKING_MIN_BYTES
BUDGET_S = TIMEOUT_MS / 1000 + 0.5


def rows(n: int) -> list[memoryview]:
    return [memoryview(bytearray(ROW)) for _ in range(n)]


async def stored(store: RemoteStore, num_chunks: int) -> tuple[RemoteChunks, list[BlockKey]]:
    """`num_chunks` chunks of ROW bytes written through `store` (chunk i holds payload(i))."""
    chunks = RemoteChunks(store, descriptor(row_bytes=ROW))
    keys = [key(i) for i in range(num_chunks)]
    assert all(await chunks.store_many([(k, payload(i, ROW)) for i, k in enumerate(keys)]))
    return chunks, keys


def test_chunks_of_this_size_take_the_blocking_path() -> None:
    assert ROW >= BLOCKING_MIN_BYTES


async def test_load_into_copies_verified_values_and_rejects_corrupt_ones(
    server: RedisServer,
) -> None:
    async with RemoteStore(make_config(server.url)) as store:
        chunks, keys = await stored(store, 12)
        with server.client() as client:  # a byte of chunk 3's payload flipped
            redis_key = chunks.redis_key(keys[3])
            offset = codec.HEADER.size + 1000
            value = client.get(redis_key)
            client.setrange(redis_key, offset, bytes([value[offset] ^ 0x01]))
        outs = rows(13)
        loaded = await chunks.load_into([*keys, key(99)], outs)
        assert loaded == [i != 3 for i in range(12)] + [False]
        for i, out in enumerate(outs[:12]):
            assert out == (bytes(ROW) if i == 3 else payload(i, ROW))  # the corrupt one untouched
        assert outs[12] == bytes(ROW)
        assert store.stats.num_rejected["corrupt"] == 1
        assert await chunks.lookup([keys[3]]) == [False]  # deleted
        per_pipeline = READ_PIPELINE_BYTES // (ROW + codec.HEADER.size)
        gets = store.stats.num_round_trips["get"]
        assert gets == -(-13 // per_pipeline)  # one round trip per pipeline, not per call


async def test_a_large_read_is_striped_over_two_connections_each_value_in_its_row(
    server: RedisServer,
) -> None:
    async with RemoteStore(make_config(server.url)) as store:
        chunks, keys = await stored(store, 24)  # 6 MiB: two stripes of 12 keys
        outs = rows(24)
        assert await chunks.load_into(keys, outs) == [True] * 24
        assert all(out == payload(i, ROW) for i, out in enumerate(outs))
        per_pipeline = READ_PIPELINE_BYTES // (ROW + codec.HEADER.size)  # 7 keys
        assert STRIPES == 2
        assert store.stats.num_round_trips["get"] == 2 * -(-12 // per_pipeline)


async def test_cluster_reads_every_node_and_a_killed_master_costs_its_keys(
    cluster: RedisClusterServers,
) -> None:
    async with RemoteStore(make_config(cluster.url)) as store:
        chunks, keys = await stored(store, 24)
        outs = rows(24)
        assert await chunks.load_into(keys, outs) == [True] * 24
        assert all(out == payload(i, ROW) for i, out in enumerate(outs))
        victim = cluster.node_for_key(chunks.redis_key(keys[0]))
        lost = {
            i for i, k in enumerate(keys) if cluster.node_for_key(chunks.redis_key(k)) is victim
        }
        assert 0 < len(lost) < 24
        victim.kill()
        for _ in range(3):
            started = time.monotonic()
            loaded = await chunks.load_into(keys, rows(24))
            assert time.monotonic() - started < BUDGET_S
            assert loaded == [i not in lost for i in range(24)]
        assert store.breaker_states()[victim.address] is BreakerState.OPEN


async def test_a_hung_server_costs_at_most_the_timeout_and_writes_no_row_later(
    server: RedisServer,
) -> None:
    async with RemoteStore(make_config(server.url)) as store:
        chunks, keys = await stored(store, 8)
        outs = [rows(8) for _ in range(3)]
        with server.paused():
            for out in outs:
                started = time.monotonic()
                assert await chunks.load_into(keys, out) == [False] * 8
                assert time.monotonic() - started < BUDGET_S
            assert store.breaker_states()[server.address] is BreakerState.OPEN
        await asyncio.sleep(0.5)  # the server answers the abandoned pipelines now
        assert all(row == bytes(ROW) for out in outs for row in out)


async def test_a_cancelled_read_writes_no_row_after_it_ends(server: RedisServer) -> None:
    async with RemoteStore(make_config(server.url)) as store:
        chunks, keys = await stored(store, 8)
        outs = rows(8)
        with server.paused():
            task = asyncio.create_task(chunks.load_into(keys, outs))
            await asyncio.sleep(0.1)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
        await asyncio.sleep(0.5)
        assert all(out == bytes(ROW) for out in outs)
        assert store.breaker_states()[server.address] is BreakerState.CLOSED  # not its verdict


async def test_closing_the_store_under_a_read_is_a_miss(server: RedisServer) -> None:
    store = RemoteStore(make_config(server.url))
    await store.connect()
    chunks, keys = await stored(store, 8)
    outs = rows(8)
    with server.paused():
        task = asyncio.create_task(chunks.load_into(keys, outs))
        await asyncio.sleep(0.1)
        await store.close()
        loaded = await task
    assert not any(loaded)
    assert await chunks.load_into(keys, rows(8)) == [False] * 8  # closed: misses, no raise


def _migrate_slot(cluster: RedisClusterServers, key: bytes) -> None:
    """Move `key`'s slot (and the keys in it) to another master, as a resharding does."""
    source = cluster.node_for_key(key)
    target = next(node for node in cluster.nodes if node is not source)
    with source.client() as src, target.client() as dst:
        slot = int(src.execute_command("CLUSTER", "KEYSLOT", key))
        source_id = src.execute_command("CLUSTER", "MYID").decode()
        target_id = dst.execute_command("CLUSTER", "MYID").decode()
        dst.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", source_id)
        src.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", target_id)
        while keys := src.execute_command("CLUSTER", "GETKEYSINSLOT", slot, 100):
            src.execute_command("MIGRATE", "127.0.0.1", target.port, "", 0, 5000, "KEYS", *keys)
        for node in cluster.nodes:
            with node.client() as client:
                client.execute_command("CLUSTER", "SETSLOT", slot, "NODE", target_id)
    cluster.wait_until_ok()


async def test_a_slot_moved_under_the_client_is_followed(cluster: RedisClusterServers) -> None:
    """The blocking reads go by the client's slot map; after a resharding, the old master
    answers MOVED and those keys are read again through the cluster client, which follows."""
    async with RemoteStore(make_config(cluster.url)) as store:
        chunks, keys = await stored(store, 6)
        _migrate_slot(cluster, chunks.redis_key(keys[0]))
        outs = rows(6)
        assert await chunks.load_into(keys, outs) == [True] * 6
        assert all(out == payload(i, ROW) for i, out in enumerate(outs))
