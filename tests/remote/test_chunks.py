"""RemoteChunks on a real server: values verified before a byte reaches a buffer; a corrupt one
(a byte flipped with SETRANGE, a truncation, another namespace's or key's bytes) is a miss, is
deleted and counted; a newer format is a miss left in place."""

from __future__ import annotations

import asyncio
import struct
import time

import pytest

from kvstore.namespace import namespace_id
from kvstore.remote import RemoteChunks, RemoteStore, codec
from tests.support.redis_servers import RedisClusterServers, RedisServer

from .conftest import descriptor, key, make_config, payload

pytestmark = pytest.mark.redis

ROW = 4096


def rows(n: int) -> list[memoryview]:
    return [memoryview(bytearray(ROW)) for _ in range(n)]


async def test_store_lookup_load_round_trip(server: RedisServer) -> None:
    desc = descriptor(row_bytes=ROW)
    async with RemoteStore(make_config(server.url)) as store:
        chunks = RemoteChunks(store, desc)
        keys = [key(i) for i in range(8)]
        assert (
            await chunks.store_many([(k, payload(i, ROW)) for i, k in enumerate(keys)])
            == [True] * 8
        )
        assert await chunks.lookup([*keys, key(99)]) == [True] * 8 + [False]
        outs = rows(9)
        assert await chunks.load_into([*keys, key(99)], outs) == [True] * 8 + [False]
        for i, out in enumerate(outs[:8]):
            assert out == payload(i, ROW)
        assert outs[8] == bytes(ROW)
        assert [bytes(p) if p is not None else None for p in await chunks.load(keys[:2])] == [
            payload(0, ROW),
            payload(1, ROW),
        ]
        assert sorted([k async for k in chunks.scan()]) == sorted(keys)
        assert await chunks.read_descriptor() == desc
        assert await chunks.remove(keys[:1]) == [True]
        assert await chunks.lookup(keys[:2]) == [False, True]
    with server.client() as client:
        stored = client.get(codec.chunk_key(namespace_id(desc), keys[1]))
        assert isinstance(stored, bytes) and stored[:4] == b"KVSR"


async def test_another_namespace_never_sees_the_chunks(server: RedisServer) -> None:
    async with RemoteStore(make_config(server.url)) as store:
        mine = RemoteChunks(store, descriptor("model-a"))
        theirs = RemoteChunks(store, descriptor("model-b"))
        await mine.store_many([(key(1), payload(1, ROW))])
        assert await theirs.lookup([key(1)]) == [False]
        assert [k async for k in theirs.scan()] == []


def corrupt_with(server: RedisServer, redis_key: bytes, how: str, other_ns: str) -> None:
    with server.client() as client:
        value = client.get(redis_key)
        assert isinstance(value, bytes)
        if how == "flipped byte":
            offset = codec.HEADER.size + 1234
            client.setrange(redis_key, offset, bytes([value[offset] ^ 0x01]))
        elif how == "flipped checksum":
            client.setrange(redis_key, 33, bytes([value[33] ^ 0xFF]))
        elif how == "truncated":
            client.set(redis_key, value[: len(value) - 100])
        elif how == "another namespace":
            client.setrange(redis_key, 8, bytes.fromhex(other_ns))
        elif how == "another key":
            client.set(redis_key, codec.encode(other_ns, b"\x00other", value[codec.HEADER.size :]))
        elif how == "not ours":
            client.set(redis_key, b"\x80\x04" + value)
        elif how == "newer version":
            client.setrange(redis_key, 4, struct.pack("<H", codec.VALUE_FORMAT_VERSION + 1))


@pytest.mark.parametrize(
    ("how", "kind", "deleted"),
    [
        ("flipped byte", "corrupt", True),
        ("flipped checksum", "corrupt", True),
        ("truncated", "corrupt", True),
        ("another namespace", "format", True),
        ("another key", "format", True),
        ("not ours", "format", True),
        ("newer version", "version", False),
    ],
)
async def test_a_damaged_value_is_a_miss_deleted_and_counted(
    server: RedisServer, how: str, kind: str, deleted: bool
) -> None:
    desc = descriptor(row_bytes=ROW)
    async with RemoteStore(make_config(server.url)) as store:
        chunks = RemoteChunks(store, desc)
        keys = [key(i) for i in range(3)]
        await chunks.store_many([(k, payload(i, ROW)) for i, k in enumerate(keys)])
        other_ns = namespace_id(descriptor("someone-else"))
        corrupt_with(server, chunks.redis_key(keys[1]), how, other_ns)
        outs = rows(3)
        assert await chunks.load_into(keys, outs) == [True, False, True]
        assert outs[1] == bytes(ROW)  # never a damaged byte in the buffer
        assert outs[0] == payload(0, ROW) and outs[2] == payload(2, ROW)
        assert store.stats.num_rejected == {kind: 1}
        assert await chunks.lookup(keys) == [True, not deleted, True]
        assert store.stats.num_round_trips["get"] == 1


async def test_load_verifies_too(server: RedisServer) -> None:
    async with RemoteStore(make_config(server.url)) as store:
        chunks = RemoteChunks(store, descriptor(row_bytes=ROW))
        await chunks.store_many([(key(1), payload(1, ROW))])
        corrupt_with(server, chunks.redis_key(key(1)), "flipped byte", "0" * 16)
        assert await chunks.load([key(1)]) == [None]
        assert await chunks.lookup([key(1)]) == [False]


async def test_cluster_chunks_and_descriptor(shared_cluster: RedisClusterServers) -> None:
    desc = descriptor("cluster-model", row_bytes=ROW)
    async with RemoteStore(make_config(shared_cluster.url)) as store:
        chunks = RemoteChunks(store, desc)
        keys = [key(i) for i in range(30)]
        assert all(await chunks.store_many([(k, payload(i, ROW)) for i, k in enumerate(keys)]))
        outs = rows(30)
        assert all(await chunks.load_into(keys, outs))
        assert all(out == payload(i, ROW) for i, out in enumerate(outs))
        assert await chunks.read_descriptor() == desc
        assert sorted([k async for k in chunks.scan()]) == sorted(keys)
        # a second engine with the same namespace, which never stored anything, hits
        async with RemoteStore(make_config(shared_cluster.url)) as other_store:
            other = RemoteChunks(other_store, namespace=namespace_id(desc))
            assert await other.lookup(keys) == [True] * 30
            assert await other_store.exists_many([chunks.redis_key(k) for k in keys])
            assert other_store.stats.num_round_trips["exists"] == 6


def _idle_s(server: RedisServer, redis_key: bytes) -> int:
    with server.client() as client:
        idle = client.object("idletime", redis_key)
    assert isinstance(idle, int)
    return idle


async def test_touch_is_an_access_for_redis_eviction(server: RedisServer) -> None:
    """TOUCH (the engine's own prefix hits, issue 25) resets a chunk's idle time, which
    allkeys-lru evicts by, without reading it; a missing chunk is False."""
    async with RemoteStore(make_config(server.url)) as store:
        chunks = RemoteChunks(store, descriptor(row_bytes=ROW))
        keys = [key(i) for i in range(3)]
        assert all(await chunks.store_many([(k, payload(i, ROW)) for i, k in enumerate(keys)]))
        redis_keys = [chunks.redis_key(k) for k in keys]
        deadline = time.monotonic() + 30
        while min(_idle_s(server, k) for k in redis_keys) < 1:  # Redis counts whole seconds
            assert time.monotonic() < deadline
            await asyncio.sleep(0.1)
        assert await chunks.touch([keys[0], keys[1], key(99)]) == [True, True, False]
        idle = [_idle_s(server, k) for k in redis_keys]
        assert idle[:2] == [0, 0] and idle[2] >= 1
        assert store.stats.num_round_trips["touch"] == 1


async def test_touch_on_a_cluster_goes_to_each_key_s_master(
    shared_cluster: RedisClusterServers,
) -> None:
    async with RemoteStore(make_config(shared_cluster.url)) as store:
        chunks = RemoteChunks(store, descriptor("touch-model", row_bytes=ROW))
        keys = [key(i) for i in range(30)]
        assert all(await chunks.store_many([(k, payload(i, ROW)) for i, k in enumerate(keys)]))
        assert await chunks.touch([*keys, key(99)]) == [True] * 30 + [False]
        assert store.stats.num_round_trips["touch"] == len(shared_cluster.nodes)
        await chunks.remove(keys)


async def test_a_probe_says_answered_on_a_healthy_cluster_and_not_after_a_node_died(
    cluster: RedisClusterServers,
) -> None:
    """`probe`'s `answered` tells `load_policy: cost` whether a round trip's time is the link's:
    true for every one of many concurrent probes of a healthy cluster (hits and misses alike),
    false once a master is gone (its keys are DOWN, the time a timeout's)."""
    async with RemoteStore(make_config(cluster.url)) as store:
        chunks = RemoteChunks(store, descriptor("probe-model", row_bytes=ROW))
        keys = [key(i) for i in range(30)]
        assert all(await chunks.store_many([(k, payload(i, ROW)) for i, k in enumerate(keys)]))
        probes = await asyncio.gather(
            *(chunks.probe([*keys[i:], key(100 + i)]) for i in range(20))
        )
        for i, (found, answered) in enumerate(probes):
            assert answered and found == [True] * (30 - i) + [False]
        cluster.nodes[0].kill()
        found, answered = await chunks.probe(keys)
        assert not answered and not all(found)
