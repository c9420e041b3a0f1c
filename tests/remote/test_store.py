"""RemoteStore against a real standalone server and a real 3-master cluster."""

from __future__ import annotations

import pytest

from kvstore.remote import RemoteStore, RemoteUnavailableError
from tests.support.redis_servers import RedisClusterServers, RedisServer

from .conftest import make_config

pytestmark = pytest.mark.redis


def items(n: int, prefix: bytes = b"t") -> list[tuple[bytes, bytes]]:
    return [(b"%s:%d" % (prefix, i), b"v%d" % i * 1000) for i in range(n)]


async def test_standalone_round_trips(server: RedisServer) -> None:
    async with RemoteStore(make_config(server.url)) as store:
        assert store.is_connected and store.is_cluster is False
        batch = items(20)
        keys = [k for k, _ in batch]
        assert await store.put_many(batch) == [True] * 20
        assert store.stats.num_round_trips["put"] == 1
        assert await store.exists_many([*keys, b"absent"]) == [True] * 20 + [False]
        assert await store.get_many([b"absent", *keys]) == [None, *(v for _, v in batch)]
        assert store.stats.num_round_trips["exists"] == 1
        assert store.stats.num_round_trips["get"] == 1
        assert store.stats.num_bytes["get"] == sum(len(v) for _, v in batch)
        assert store.stats.num_bytes["put"] == sum(len(v) for _, v in batch)
        assert await store.delete_many([keys[0], b"absent"]) == [True, False]
        assert await store.exists_many(keys[:2]) == [False, True]
        assert await store.get_many([]) == []
        assert store.stats.num_failures.total() == 0


def testsplit_by_bytes() -> None:
    from kvstore.remote._backends import split_by_bytes

    sizes = [3, 3, 3, 10, 1, 1]
    assert split_by_bytes([0, 1, 2, 3, 4, 5], None, 4) == [[0, 1, 2, 3, 4, 5]]
    assert split_by_bytes([0, 1, 2, 3, 4, 5], sizes, 6) == [[0, 1], [2], [3], [4, 5]]
    assert split_by_bytes([5, 4], sizes, 100) == [[5, 4]]
    assert split_by_bytes([3], sizes, 1) == [[3]]


async def test_bulk_values_go_out_in_bounded_pipelines(server: RedisServer) -> None:
    size = 1536 << 10
    batch = [(b"big:%d" % i, bytes([i]) * size) for i in range(6)]
    async with RemoteStore(make_config(server.url, pipeline_bytes=4 << 20)) as store:
        assert await store.put_many(batch) == [True] * 6
        assert store.stats.num_round_trips["put"] == 3  # 2 values (3 MiB) per pipeline
        keys = [k for k, _ in batch]
        assert await store.get_many(keys) == [v for _, v in batch]
        assert store.stats.num_round_trips["get"] == 1  # size unknown: one pipeline
        assert await store.get_many(keys, value_bytes=size) == [v for _, v in batch]
        # reads of large values: pipelines of at most READ_PIPELINE_BYTES (2 MiB), one value each
        assert store.stats.num_round_trips["get"] == 1 + 6
        assert await store.exists_many(keys) == [True] * 6
        assert store.stats.num_round_trips["exists"] == 1


async def test_standalone_scan_and_descriptor(server: RedisServer) -> None:
    async with RemoteStore(make_config(server.url)) as store:
        await store.put_many(items(1200, b"kvstore:x") + items(5, b"other"))
        found = [key async for key in store.scan_keys(b"kvstore:x:*")]
        assert sorted(found) == sorted(k for k, _ in items(1200, b"kvstore:x"))
        assert store.stats.num_round_trips["scan"] > 1  # paged, never KEYS
        ns = "00112233445566ff"
        assert await store.get_descriptor(ns) is None
        assert await store.put_descriptor(ns, b'{"a": 1}') is True
        assert await store.put_descriptor(ns, b'{"a": 2}') is False  # written once
        assert await store.get_descriptor(ns) == b'{"a": 1}'


async def test_database_number_is_honoured(server: RedisServer) -> None:
    url = server.url.removesuffix("/0") + "/5"
    async with RemoteStore(make_config(url)) as store:
        await store.put_many([(b"k", b"v")])
    with server.client() as client:
        client.select(5)  # type: ignore[no-untyped-call]
        assert client.get(b"k") == b"v"


async def test_unix_socket() -> None:
    from tests.support.redis_servers import redis_server

    with redis_server(extra_args=["--unixsocket", "redis.sock", "--unixsocketperm", "700"]) as srv:
        url = f"unix://{srv.workdir / 'redis.sock'}?db=2"
        async with RemoteStore(make_config(url)) as store:
            assert store.is_cluster is False
            assert await store.put_many([(b"k", b"v")]) == [True]
            assert await store.get_many([b"k"]) == [b"v"]
            assert [k async for k in store.scan_keys(b"*")] == [b"k"]
        with srv.client() as client:
            client.select(2)  # type: ignore[no-untyped-call]
            assert client.get(b"k") == b"v"


async def test_read_only_replica_never_writes(server: RedisServer) -> None:
    async with RemoteStore(make_config(server.url, remote_write=False)) as store:
        assert await store.put_many(items(3)) == [False] * 3
        assert await store.put_descriptor("00112233445566ff", b"{}") is False
        assert store.stats.total_round_trips == 1  # the connect
    with server.client() as client:
        assert client.dbsize() == 0


async def test_cluster_one_round_trip_per_node(shared_cluster: RedisClusterServers) -> None:
    async with RemoteStore(make_config(shared_cluster.url)) as store:
        assert store.is_cluster is True
        assert len(store.masters()) == 3
        batch = items(60, b"c")
        keys = [k for k, _ in batch]
        nodes = {shared_cluster.node_for_key(k).address for k in keys}
        assert len(nodes) == 3
        assert await store.put_many(batch) == [True] * 60
        assert store.stats.num_round_trips["put"] == 3
        assert await store.exists_many(keys) == [True] * 60
        assert await store.get_many(keys) == [v for _, v in batch]
        assert store.stats.num_round_trips["exists"] == 3
        assert store.stats.num_round_trips["get"] == 3
        by_node = store.stats.num_round_trips_by_node
        assert {n for n in by_node if by_node[n] >= 3} == nodes
        # a batch whose keys live on one node is one round trip
        one_node = [k for k in keys if shared_cluster.node_for_key(k).address == min(nodes)]
        await store.get_many(one_node)
        assert store.stats.num_round_trips["get"] == 4
        for key in one_node:
            with shared_cluster.node_for_key(key).client() as client:
                assert client.get(key) is not None  # stored on the node that owns its slot


async def test_cluster_scan_covers_every_master(shared_cluster: RedisClusterServers) -> None:
    async with RemoteStore(make_config(shared_cluster.url)) as store:
        batch = items(300, b"kvstore:scan")
        await store.put_many(batch)
        found = [key async for key in store.scan_keys(b"kvstore:scan:*")]
        assert sorted(found) == sorted(k for k, _ in batch)
        assert await store.put_descriptor("00112233445566ff", b"{}") in (True, False)
        assert await store.get_descriptor("00112233445566ff") == b"{}"


async def test_a_cluster_node_url_alone_is_detected(shared_cluster: RedisClusterServers) -> None:
    async with RemoteStore(make_config(shared_cluster.nodes[1].url)) as store:
        assert store.is_cluster is True
        assert len(store.masters()) == 3


async def test_a_seed_list_of_a_standalone_server_is_a_config_error(server: RedisServer) -> None:
    from kvstore.errors import ConfigError

    store = RemoteStore(make_config(f"{server.address},{server.address}"))
    with pytest.raises(ConfigError, match="remote_url: lists 2 addresses"):
        await store.connect()
    await store.close()


async def test_administrative_calls_raise_when_unavailable(server: RedisServer) -> None:
    store = RemoteStore(make_config(server.url))
    await store.connect()
    server.kill()
    with pytest.raises(RemoteUnavailableError):
        await store.get_descriptor("00112233445566ff")
    with pytest.raises(RemoteUnavailableError):
        [key async for key in store.scan_keys(b"*")]
    await store.close()
    with pytest.raises(RemoteUnavailableError):
        await store.get_descriptor("00112233445566ff")
