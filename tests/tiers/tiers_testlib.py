"""Helpers for the `tiers` tests: KV cache layouts as vLLM builds them, and child-process bodies
(module-level so multiprocessing's spawn can import them)."""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from pathlib import Path

import lmdb
import torch

from tiers.lmdb import LMDBStore
from tiers.memory import MemoryStore
from tiers.store import BlockStore

Caches = dict[str, torch.Tensor]
CAPACITY_BYTES = 1 << 20


def flip_lmdb_value(path: Path, namespace_prefix_index: int = 0, offset: int = 0) -> bytes:
    """Flip one byte of the first stored value with a raw LMDB write transaction (the store must
    be closed in this process). Returns the full internal key that was damaged."""
    env = lmdb.open(str(path), max_dbs=8, subdir=True)
    try:
        data_db = env.open_db(b"data")
        with env.begin(write=True) as txn:
            cursor = txn.cursor(db=data_db)
            assert cursor.first()
            for _ in range(namespace_prefix_index):
                assert cursor.next()
            key, value = bytes(cursor.key()), bytearray(cursor.value())
            value[offset] ^= 0x01
            txn.put(key, bytes(value), db=data_db)
        return key
    finally:
        env.close()


class StoreHarness:
    """A store under test plus a way to damage a stored value behind its back."""

    def __init__(self, kind: str, tmp_path: Path) -> None:
        self.kind = kind
        self.path = tmp_path / "store"
        self.store: BlockStore = self._open()

    def _open(self) -> BlockStore:
        if self.kind == "memory":
            return MemoryStore(CAPACITY_BYTES)
        return LMDBStore.open(self.path, capacity_bytes=CAPACITY_BYTES)

    def corrupt(self, namespace: str, key: bytes) -> None:
        if isinstance(self.store, MemoryStore):
            self.store.corrupt(namespace, key)
            return
        self.store.close()
        env = lmdb.open(str(self.path), max_dbs=8)
        try:
            data_db = env.open_db(b"data")
            with env.begin(write=True) as txn:
                for full_key, value in txn.cursor(db=data_db):
                    if full_key.endswith(key):
                        damaged = bytearray(value)
                        damaged[0] ^= 0xFF
                        txn.put(full_key, bytes(damaged), db=data_db)
        finally:
            env.close()
        self.store = self._open()


def _random_fill(tensors: Sequence[torch.Tensor], seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    for tensor in tensors:
        raw = tensor.view(torch.uint8)
        raw.copy_(torch.randint(0, 256, raw.shape, dtype=torch.uint8, generator=generator))


def cpu_backend(
    num_layers: int, num_blocks: int, *, heads: int = 2, block_size: int = 4, head: int = 8,
    dtype: torch.dtype = torch.bfloat16,
) -> Caches:  # fmt: skip
    """vLLM's CPU backend: `[num_blocks, kv_heads, block_size, 2 * head]` per layer, every layer a
    view into ONE int8 allocation (layer `l` at offset `l * layer_stride`)."""
    item = torch.empty((), dtype=dtype).element_size()
    block_bytes = heads * block_size * 2 * head * item
    raw = torch.zeros(num_layers * num_blocks * block_bytes, dtype=torch.int8)
    caches = {}
    for layer in range(num_layers):
        view = torch.as_strided(
            raw,
            (num_blocks, heads, block_size, 2 * head * item),
            (block_bytes, block_size * 2 * head * item, 2 * head * item, 1),
            storage_offset=layer * num_blocks * block_bytes,
        )
        caches[f"model.layers.{layer}.self_attn.attn"] = view.view(dtype)
    return caches


def kv_split(num_layers: int, num_blocks: int, dtype: torch.dtype = torch.float16) -> Caches:
    """CUDA flash-attn: `[2, num_blocks, block_size, kv_heads, head]`, one tensor per layer."""
    return {
        f"layer{i}": torch.zeros(2, num_blocks, 4, 2, 8, dtype=dtype) for i in range(num_layers)
    }


def kv_split_shared(num_layers: int, num_blocks: int, dtype: torch.dtype = torch.float16) -> Caches:
    """`[2, num_blocks, ...]` layers carved from one `[L, 2, num_blocks, ...]` allocation."""
    raw = torch.zeros(num_layers, 2, num_blocks, 4, 2, 8, dtype=dtype)
    return {f"layer{i}": raw[i] for i in range(num_layers)}


def block_first_kv(num_layers: int, num_blocks: int, dtype: torch.dtype = torch.float32) -> Caches:
    """`[num_blocks, 2, block_size, kv_heads, head]`, one tensor per layer."""
    return {
        f"layer{i}": torch.zeros(num_blocks, 2, 4, 2, 8, dtype=dtype) for i in range(num_layers)
    }


def cross_layer(num_layers: int, num_blocks: int, dtype: torch.dtype = torch.bfloat16) -> Caches:
    """One `[num_blocks, num_layers, heads, block_size, 2 * head]` buffer, views `buf[:, l]`: each
    layer is non-contiguous across blocks."""
    raw = torch.zeros(num_blocks, num_layers, 2, 4, 16, dtype=dtype)
    return {f"layer{i}": raw[:, i] for i in range(num_layers)}


def heads_outermost(
    num_layers: int, num_blocks: int, dtype: torch.dtype = torch.bfloat16
) -> Caches:
    """vLLM's LHBNC: logical `[num_blocks, heads, block_size, C]`, heads outermost in memory, so a
    block's slab is itself strided."""
    return {
        f"layer{i}": torch.zeros(2, num_blocks, 4, 16, dtype=dtype).permute(1, 0, 2, 3)
        for i in range(num_layers)
    }


LAYOUTS: dict[str, Callable[[int, int, torch.dtype], Caches]] = {
    "cpu_backend": lambda n, b, d: cpu_backend(n, b, dtype=d),
    "kv_split": kv_split,
    "kv_split_shared": kv_split_shared,
    "block_first_kv": block_first_kv,
    "cross_layer": cross_layer,
    "heads_outermost": heads_outermost,
}


def make_caches(
    layout: str, num_layers: int, num_blocks: int, dtype: torch.dtype, seed: int
) -> Caches:
    caches = LAYOUTS[layout](num_layers, num_blocks, dtype)
    _random_fill(list(caches.values()), seed)
    return caches


def zeros_like_caches(layout: str, num_layers: int, num_blocks: int, dtype: torch.dtype) -> Caches:
    return LAYOUTS[layout](num_layers, num_blocks, dtype)


def block_dim_of(tensor: torch.Tensor, num_blocks: int) -> int:
    from tiers.paged import find_block_dim

    return find_block_dim(tuple(tensor.shape), num_blocks)


def reference_gather(caches: Caches, num_blocks: int, block_ids: Sequence[int]) -> torch.Tensor:
    """The chunk buffer built the slow, obvious way: per layer, index_select on the block dim."""
    index = torch.tensor(list(block_ids), dtype=torch.int64)
    pieces = []
    for tensor in caches.values():
        dim = block_dim_of(tensor, num_blocks)
        pieces.append(tensor.view(torch.uint8).index_select(dim, index).contiguous().flatten())
    return torch.cat(pieces)


def chunk_of(caches: Caches) -> int:
    return sum(math.prod(t.shape) * t.element_size() for t in caches.values())


# -- child process bodies ------------------------------------------------------------------


def scatter_in_child(
    region_dir: str, region_name: str, num_layers: int, num_blocks: int, block_ids: list[int]
) -> None:
    """Attach the region, scatter row 0 into fresh caches, write their reference bytes to row 1."""
    from tiers.cpu import CPURegion
    from tiers.paged import PagedKVView

    caches = cpu_backend(num_layers, num_blocks, heads=8, block_size=32, head=128)
    view = PagedKVView(caches, num_blocks)
    with CPURegion.attach(region_name, directory=region_dir) as region:
        size = view.buffer_bytes(len(block_ids))
        view.scatter(block_ids, region.row_tensor(0)[:size])
        region.row_tensor(1)[:size].copy_(reference_gather(caches, num_blocks, block_ids))


def touch_rows_in_child(region_dir: str, region_name: str) -> None:
    """Check row 3 holds 0xAB and write 0xCD into row 4."""
    from tiers.cpu import CPURegion

    with CPURegion.attach(region_name, directory=region_dir) as region:
        if bytes(region.row(3)) != b"\xab" * region.row_bytes:
            raise SystemExit(3)
        region.row_tensor(4).fill_(0xCD)


def put_loop_in_child(store_path: str, ready_path: str) -> None:
    """Write batches forever (until killed), touching `ready_path` after the first commit."""
    from tiers.lmdb import LMDBStore

    store = LMDBStore.open(store_path, capacity_bytes=1 << 40)
    store.register_namespace("ns", {"kind": "kill-test"})
    batch = 0
    while True:
        items = [(f"{batch:08d}-{i:02d}".encode(), os.urandom(64 << 10)) for i in range(8)]
        store.put_many("ns", items)
        if batch % 5 == 4:
            store.delete_many("ns", [f"{batch - 2:08d}-{i:02d}".encode() for i in range(4)])
        if batch == 0:
            Path(ready_path).touch()
        batch += 1


def writer_in_child(store_path: str, duration_s: float) -> None:
    import time

    from tiers.lmdb import LMDBStore

    with LMDBStore.open(store_path, capacity_bytes=64 << 20) as store:
        deadline = time.monotonic() + duration_s
        batch = 0
        while time.monotonic() < deadline:
            items = [(f"{batch:06d}-{i}".encode(), os.urandom(32 << 10)) for i in range(4)]
            store.put_many("ns", items)
            if batch >= 10:
                store.delete_many("ns", [f"{batch - 10:06d}-{i}".encode() for i in range(4)])
            batch += 1


def reader_in_child(store_path: str, duration_s: float, result_path: str) -> None:
    import time

    from tiers.lmdb import LMDBStore

    num_verified, num_scans = 0, 0
    out = bytearray(64 << 10)
    with LMDBStore.open(store_path, readonly=True) as store:
        deadline = time.monotonic() + duration_s
        while time.monotonic() < deadline:
            for entry in store.iter_meta("ns"):
                size = store.get_into("ns", entry.key, out)
                num_verified += size is not None
            num_scans += 1
    Path(result_path).write_text(f"{num_scans} {num_verified}")


def reader_after_growth_in_child(store_path: str, ready: str, go: str, result: str) -> None:
    """Open read-only with the store's small map, wait while the writer grows it, then read."""
    import time

    from tiers.lmdb import LMDBStore

    with LMDBStore.open(store_path, readonly=True, map_size_bytes=1 << 20) as store:
        map_before = store.stats().map_size_bytes
        Path(ready).touch()
        deadline = time.monotonic() + 60
        while not Path(go).exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        out = bytearray(1 << 20)
        num_read = sum(store.get_into("ns", m.key, out) is not None for m in store.iter_meta("ns"))
        Path(result).write_text(f"{map_before} {store.stats().map_size_bytes} {num_read}")
