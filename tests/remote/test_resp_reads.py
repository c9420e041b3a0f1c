"""Large reads on kvstore's own RESP connection (`kvstore.remote._resp`), on real servers: the
handshake (password, ACL user, db, a Unix socket), replies of every kind in one pipeline
(values, misses, values of another size), replies cut into small pieces on the way, and the
connections themselves: reused, and replaced when the server closed one while it was idle."""

from __future__ import annotations

import asyncio

import pytest

from kvstore.bench.slow_link import SlowLink
from kvstore.remote import BreakerState, RemoteChunks, RemoteStore, codec
from tests.support.redis_servers import RedisServer, redis_server

from .conftest import descriptor, key, make_config, payload

pytestmark = pytest.mark.redis

ROW = 256 << 10
PASSWORD = "resp-reads-password"


def rows(n: int) -> list[memoryview]:
    return [memoryview(bytearray(ROW)) for _ in range(n)]


async def _store_and_load(store: RemoteStore, num_chunks: int) -> RemoteChunks:
    chunks = RemoteChunks(store, descriptor(row_bytes=ROW))
    keys = [key(i) for i in range(num_chunks)]
    assert all(await chunks.store_many([(k, payload(i, ROW)) for i, k in enumerate(keys)]))
    outs = rows(num_chunks)
    assert await chunks.load_into(keys, outs) == [True] * num_chunks
    assert all(out == payload(i, ROW) for i, out in enumerate(outs))
    return chunks


def _reading_connections(server: RedisServer) -> int:
    """kvstore's connections to `server` that have read (GET) something."""
    with server.client() as client:
        listed = client.client_list()  # type: ignore[no-untyped-call]
    return sum(1 for c in listed if c["name"] == "kvstore" and c["cmd"] == "get")


def _reading_ids(server: RedisServer) -> set[str]:
    with server.client() as client:
        listed = client.client_list()  # type: ignore[no-untyped-call]
    return {c["id"] for c in listed if c["name"] == "kvstore" and c["cmd"] == "get"}


async def test_a_password_an_acl_user_and_a_db(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KV_TEST_RESP_PASSWORD", PASSWORD)
    with redis_server(password=PASSWORD) as srv:
        url = f"redis://default@127.0.0.1:{srv.port}/3"
        config = make_config(url, remote_password_env="KV_TEST_RESP_PASSWORD")
        async with RemoteStore(config) as store:
            chunks = await _store_and_load(store, 10)
        with srv.client() as client:
            client.select(3)  # type: ignore[no-untyped-call]
            assert client.get(chunks.redis_key(key(0))) is not None


async def test_a_unix_socket() -> None:
    with redis_server(extra_args=["--unixsocket", "redis.sock", "--unixsocketperm", "700"]) as srv:
        url = f"unix://{srv.workdir / 'redis.sock'}?db=2"
        async with RemoteStore(make_config(url)) as store:
            await _store_and_load(store, 10)


async def test_values_misses_and_values_of_another_size_in_one_pipeline(
    server: RedisServer,
) -> None:
    """A value longer than the read buffer and one shorter are rejected, a missing key is a
    miss, rows of those stay untouched, and the connection stays in step for the next read."""
    async with RemoteStore(make_config(server.url)) as store:
        chunks = await _store_and_load(store, 6)
        namespace = chunks.namespace_id
        with server.client() as client:
            client.set(chunks.redis_key(key(1)), codec.encode(namespace, key(1), bytes(2 * ROW)))
            client.set(chunks.redis_key(key(3)), codec.encode(namespace, key(3), bytes(ROW // 2)))
        keys = [key(0), key(1), key(2), key(3), key(50), key(4)]
        outs = rows(len(keys))
        assert await chunks.load_into(keys, outs) == [True, False, True, False, False, True]
        assert [out == bytes(ROW) for out in outs] == [False, True, False, True, True, False]
        assert outs[5] == payload(4, ROW)
        assert store.stats.num_rejected["format"] == 2
        again = rows(2)
        assert await chunks.load_into([key(5), key(0)], again) == [True, True]
        assert again[0] == payload(5, ROW) and again[1] == payload(0, ROW)


async def test_replies_cut_into_small_pieces_on_the_way(server: RedisServer) -> None:
    """Through a proxy that forwards what it reads, up to 64 KiB at a time (replies split anywhere:
    inside a header line, a value, its CRLF)."""
    host = server.url.split("//")[1].split("/")[0]
    with SlowLink(host, latency_s=0.0, bytes_per_s=40e6) as link:
        async with RemoteStore(make_config(link.url, remote_timeout_ms=5000)) as store:
            await _store_and_load(store, 12)


async def test_connections_are_reused_and_one_closed_while_idle_is_replaced(
    server: RedisServer,
) -> None:
    async with RemoteStore(make_config(server.url)) as store:
        chunks = await _store_and_load(store, 24)  # two stripes: two connections
        opened = _reading_connections(server)
        assert 1 <= opened <= 2
        for _ in range(3):
            outs = rows(24)
            assert await chunks.load_into([key(i) for i in range(24)], outs) == [True] * 24
        assert _reading_connections(server) == opened
        with server.client() as client:  # the server drops them (as its `timeout` would)
            for conn in client.client_list():  # type: ignore[no-untyped-call]
                if conn["name"] == "kvstore" and conn["cmd"] == "get":
                    client.client_kill_filter(_id=conn["id"])  # type: ignore[no-untyped-call]
        assert _reading_connections(server) == 0
        outs = rows(24)
        assert await chunks.load_into([key(i) for i in range(24)], outs) == [True] * 24
        assert all(out == payload(i, ROW) for i, out in enumerate(outs))
        assert store.stats.num_round_trips["get"] > 0


async def test_measure_reads_values_without_a_row_and_counts_their_bytes(
    server: RedisServer,
) -> None:
    """`RemoteChunks.measure` (a link measurement for chunks that need no row): the bytes of
    the values found, misses counting nothing; nothing is written or deleted."""
    async with RemoteStore(make_config(server.url)) as store:
        chunks = await _store_and_load(store, 4)
        num_bytes = await chunks.measure([key(0), key(77), key(2)])
        assert num_bytes == 2 * (codec.HEADER.size + ROW)
        assert await chunks.lookup([key(0), key(2)]) == [True, True]
        assert await chunks.measure([key(78)]) == 0


async def test_healthy_connections_under_concurrent_reads_are_never_taken_for_stale(
    server: RedisServer,
) -> None:
    """The stale check must stay quiet on healthy connections: four reads at once, five
    times over, reuse what the first round opened (no connection replaced, no node failure)."""
    async with RemoteStore(make_config(server.url)) as store:
        chunks = await _store_and_load(store, 24)
        keys = [key(i) for i in range(24)]

        async def read_all() -> None:
            outs = rows(24)
            assert await chunks.load_into(keys, outs) == [True] * 24
            assert all(out == payload(i, ROW) for i, out in enumerate(outs))

        await asyncio.gather(*(read_all() for _ in range(4)))
        opened = _reading_ids(server)
        assert opened
        for _ in range(5):
            await asyncio.gather(*(read_all() for _ in range(4)))
        assert _reading_ids(server) == opened  # the same connections, none replaced
        assert set(store.breaker_states().values()) == {BreakerState.CLOSED}
