"""Helpers of the CLI tests: a realistic store written without the engine, CLI runners.

Three namespaces: `TP1` (chunks gathered by `PagedKVView` from two bf16 layers, with the chunk
layout the engine registers), `TP2` (each value holds two ranks' slices), and `BARE` (a descriptor
from another tool: no chunk layout). Keys start with the namespace's index byte and the chunk's
index byte, so prefixes are predictable; chunk `i` of namespace `n` was last accessed at
`BASE_S + 10 * n + i`.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import lmdb
import msgspec
import torch
from typer.testing import CliRunner, Result

from kvstore.cli import app
from tiers.lmdb import LMDBStore
from tiers.paged import PagedKVView

TP1 = "a1b2c3d4e5f60001"
TP2 = "a1b2c3d4e5f60002"
BARE = "b0b0b0b0b0b00003"
NAMESPACES = (TP1, TP2, BARE)
CAPACITY_BYTES = 8 << 20
NUM_BLOCKS = 8
BLOCKS_PER_CHUNK = 2
BASE_S = 1_700_000_000.0
LAYER_NAMES = ("model.layers.0.self_attn.attn", "model.layers.1.self_attn.attn")
BARE_VALUE_BYTES = 1024


def kv_caches(seed: int, *, nan_at: tuple[int, int] | None = None) -> dict[str, torch.Tensor]:
    """Two bf16 layers of `[NUM_BLOCKS, 2, 32, 64]`; optionally a NaN at (layer, block)."""
    generator = torch.Generator().manual_seed(seed)
    caches = {
        name: torch.randn(NUM_BLOCKS, 2, 32, 64, generator=generator).to(torch.bfloat16)
        for name in LAYER_NAMES
    }
    if nan_at is not None:
        layer, block = nan_at
        caches[LAYER_NAMES[layer]][block, 0, 0, 0] = float("nan")
    return caches


def chunk_key(namespace_index: int, chunk_index: int) -> bytes:
    tail = hashlib.sha256(f"{namespace_index}-{chunk_index}".encode()).digest()[:30]
    return bytes([namespace_index, chunk_index]) + tail


def descriptor(view: PagedKVView, tp_size: int) -> dict[str, Any]:
    return {
        "model": "tiny-llama",
        "kv_dtype": "bfloat16",
        "engine_block_size": 16,
        "blocks_per_chunk": BLOCKS_PER_CHUNK,
        "tp_size": tp_size,
        "device_type": "cpu",
        "attention_backend": "test",
        "hash_algo": "sha256",
        "row_bytes": view.buffer_bytes(BLOCKS_PER_CHUNK) * tp_size,
        "layout": {"kv_cache_layout": "NHD", "layers": list(LAYER_NAMES)},
        "salt": "",
        "format_version": 1,
        "created_by": "tests",
        "chunk_layout": view.chunk_layout(BLOCKS_PER_CHUNK).to_dict(),
    }


def gather_chunk(view: PagedKVView, chunk_index: int) -> bytes:
    out = torch.empty(view.buffer_bytes(BLOCKS_PER_CHUNK), dtype=torch.uint8)
    first = chunk_index * BLOCKS_PER_CHUNK
    view.gather(list(range(first, first + BLOCKS_PER_CHUNK)), out)
    return out.numpy().tobytes()


@dataclass
class BuiltStore:
    """The store's path and what was written to it."""

    path: Path
    keys: dict[str, list[bytes]] = field(default_factory=dict)
    values: dict[tuple[str, bytes], bytes] = field(default_factory=dict)
    ranks: list[dict[str, torch.Tensor]] = field(default_factory=list)  # TP2's per-rank caches
    tp1_caches: dict[str, torch.Tensor] = field(default_factory=dict)

    def used_bytes(self) -> int:
        return sum(len(value) for value in self.values.values())


def _write(store: LMDBStore, built: BuiltStore, index: int, namespace: str, values: list[bytes]):
    keys = [chunk_key(index, i) for i in range(len(values))]
    for i, (key, value) in enumerate(zip(keys, values, strict=True)):
        store.put_many(namespace, [(key, value)], now_s=BASE_S + 10 * index + i)
        built.values[(namespace, key)] = value
    built.keys[namespace] = keys


def build_store(path: Path) -> BuiltStore:
    built = BuiltStore(path)
    built.tp1_caches = kv_caches(1, nan_at=(1, 0))
    built.ranks = [kv_caches(2), kv_caches(3)]
    tp1_view = PagedKVView(built.tp1_caches, NUM_BLOCKS)
    rank_views = [PagedKVView(caches, NUM_BLOCKS) for caches in built.ranks]
    num_chunks = NUM_BLOCKS // BLOCKS_PER_CHUNK
    with LMDBStore.open(path, capacity_bytes=CAPACITY_BYTES) as store:
        store.register_namespace(TP1, descriptor(tp1_view, 1))
        store.register_namespace(TP2, descriptor(rank_views[0], 2))
        store.register_namespace(BARE, {"model": "other-tool"})
        _write(store, built, 0, TP1, [gather_chunk(tp1_view, i) for i in range(num_chunks)])
        tp2_values = [b"".join(gather_chunk(v, i) for v in rank_views) for i in range(num_chunks)]
        _write(store, built, 1, TP2, tp2_values)
        _write(store, built, 2, BARE, [bytes([i]) * BARE_VALUE_BYTES for i in range(2)])
    return built


runner = CliRunner()


def run(*args: str | Path, input: str | None = None) -> Result:
    return runner.invoke(app, [str(arg) for arg in args], input=input)


def run_json(*args: str | Path, exit_code: int = 0) -> Any:
    """Run with --json; stdout must hold exactly one JSON document."""
    result = run(*args, "--json")
    assert result.exit_code == exit_code, result.stderr
    return json.loads(result.stdout)


def store_keys(path: Path) -> dict[str, set[bytes]]:
    with LMDBStore.open(path, readonly=True, create=False) as store:
        return {ns: set(store.iter_keys(ns)) for ns in store.namespaces()}


def flip_byte(env: lmdb.Environment, namespace: str, key: bytes, offset: int = 100) -> None:
    """Flip one bit of a stored value with a raw write transaction (data DB: ordinal + key)."""
    with env.begin(write=True) as txn:
        record = msgspec.msgpack.decode(
            txn.get(namespace.encode(), db=env.open_db(b"namespaces", txn=txn))
        )
        full_key = int(record["ordinal"]).to_bytes(4, "big") + key
        data_db = env.open_db(b"data", txn=txn)
        value = bytearray(txn.get(full_key, db=data_db))
        value[offset] ^= 0x01
        txn.put(full_key, bytes(value), db=data_db)
