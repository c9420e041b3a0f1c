"""The CLI tests' remote tier: the store of `helpers` written into a real Redis, plus a namespace
the engine's own writer (`RemoteChunks.store_many`) filled.

The three store namespaces (`TP1`, `TP2`, `BARE`) keep their descriptors (with the chunk layout,
so `show` decodes them) and values, in the remote value format. `ENGINE` is what an engine
writes: its descriptor (`NamespaceDescriptor.to_dict()`, no chunk layout) and 3 chunks whose keys
start with byte 3.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import redis
from redis.cluster import ClusterNode, RedisCluster

from kvstore.keys import BlockKey
from kvstore.namespace import NamespaceDescriptor, namespace_id
from kvstore.remote import RemoteChunks, RemoteConfig, RemoteStore, codec
from tests.support.redis_servers import RedisClusterServers, RedisServer
from tiers.lmdb import LMDBStore

from .helpers import BuiltStore

ENGINE_DESCRIPTOR = NamespaceDescriptor(
    model="tiny-llama",
    kv_dtype="bfloat16",
    engine_block_size=16,
    blocks_per_chunk=2,
    tp_size=1,
    device_type="cpu",
    attention_backend="TORCH_SDPA",
    hash_algo="sha256",
    row_bytes=4096,
    layout={"kv_cache_layout": "NHD", "layers": ["model.layers.0.self_attn.attn"]},
    created_by="engine",
)
ENGINE = namespace_id(ENGINE_DESCRIPTOR)
NUM_ENGINE_CHUNKS = 3
TIMEOUT_MS = 300

AnyClient = redis.Redis | RedisCluster


@dataclass
class Remote:
    """A Redis holding the CLI test chunks: its URL and what was written."""

    url: str
    keys: dict[str, list[bytes]] = field(default_factory=dict)
    values: dict[tuple[str, bytes], bytes] = field(default_factory=dict)

    def num_chunks(self) -> int:
        return len(self.values)


@contextmanager
def sync_client(server: RedisServer | RedisClusterServers) -> Iterator[AnyClient]:
    """A plain redis-py client of the server or cluster (to set up and to look behind the CLI)."""
    if isinstance(server, RedisServer):
        with server.client() as client:
            yield client
        return
    nodes = [ClusterNode("127.0.0.1", node.port) for node in server.nodes]
    cluster = RedisCluster(startup_nodes=nodes, password=server.password)
    try:
        yield cluster
    finally:
        cluster.close()


def engine_key(index: int) -> bytes:
    return bytes([3, index]) + bytes(range(30))


def engine_payload(index: int) -> bytes:
    return bytes((index * 7 + j) % 251 for j in range(ENGINE_DESCRIPTOR.row_bytes))


async def _store_engine_chunks(url: str, password_env: str | None) -> None:
    config = RemoteConfig.from_values(
        {"remote_url": url, "remote_password_env": password_env, "remote_timeout_ms": 2000}
    )
    assert config is not None
    items = [(BlockKey(engine_key(i)), engine_payload(i)) for i in range(NUM_ENGINE_CHUNKS)]
    async with RemoteStore(config) as store:
        landed = await RemoteChunks(store, ENGINE_DESCRIPTOR).store_many(items)
    assert all(landed), landed


def fill_remote(
    server: RedisServer | RedisClusterServers,
    built: BuiltStore,
    *,
    url: str | None = None,
    password_env: str | None = None,
) -> Remote:
    """Write `built`'s namespaces and chunks, and the ENGINE namespace, into `server`."""
    remote = Remote(url or server.url)
    with LMDBStore.open(built.path, readonly=True, create=False) as store:
        descriptors = store.namespaces()
    with sync_client(server) as client:
        for namespace, descriptor in descriptors.items():
            client.set(codec.descriptor_key(namespace), json.dumps(descriptor))
        for (namespace, key), value in built.values.items():
            client.set(codec.chunk_key(namespace, key), codec.encode(namespace, key, value))
    remote.keys = {ns: list(keys) for ns, keys in built.keys.items()}
    remote.values = dict(built.values)
    asyncio.run(_store_engine_chunks(remote.url, password_env))
    remote.keys[ENGINE] = [engine_key(i) for i in range(NUM_ENGINE_CHUNKS)]
    for index, key in enumerate(remote.keys[ENGINE]):
        remote.values[ENGINE, key] = engine_payload(index)
    return remote


def chunk_keys_in(server: RedisServer | RedisClusterServers) -> set[bytes]:
    """Every chunk key the server holds (descriptors left out), by a plain SCAN."""
    with sync_client(server) as client:
        keys = set(client.scan_iter(match=b"kvstore:*", count=1000))
    return {key for key in keys if not key.endswith(b":descriptor")}
