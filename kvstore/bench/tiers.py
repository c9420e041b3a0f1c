"""Benchmark of the storage media in `tiers/` (not a timed test).

    kvstore bench tiers [--dir DIR] [--lmdb-mib 256] [--skip-lmdb]

1. PagedKVView gather/scatter between a vLLM-CPU-shaped KV cache (all layers views of one
   allocation) and CPURegion rows in /dev/shm, as a ratio to one contiguous torch `copy_` of the
   same bytes measured in the same run (both sides rotate through buffers larger than the cache).
2. LMDBStore put_many/get_into against raw sequential file I/O of the same bytes in the same
   directory (O_DIRECT where the filesystem allows it), for candidate LMDB settings. Reads are
   cold: the store is closed and its pages dropped from the page cache (posix_fadvise) first.
"""

from __future__ import annotations

import argparse
import contextlib
import mmap
import os
import random
import shutil
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

from tiers import CPURegion, LMDBOptions, LMDBStore, PagedKVView

MIB = 1 << 20


# -- 1. paged gather/scatter -------------------------------------------------------------------


@dataclass(frozen=True)
class KVShape:
    label: str
    num_layers: int
    kv_heads: int
    block_size: int
    head_size: int
    blocks_per_chunk: int

    @property
    def layer_block_bytes(self) -> int:
        return self.kv_heads * self.block_size * 2 * self.head_size * 2  # bf16


SHAPES = [
    KVShape(
        "256 KiB block", num_layers=16, kv_heads=2, block_size=32, head_size=64, blocks_per_chunk=16
    ),
    KVShape(
        "2 MiB block", num_layers=32, kv_heads=4, block_size=32, head_size=64, blocks_per_chunk=4
    ),
]


def cpu_backend_caches(shape: KVShape, num_blocks: int, *, shared: bool) -> dict[str, torch.Tensor]:
    """vLLM's CPU layout `[num_blocks, kv_heads, block_size, 2 * head]` per layer; `shared` puts
    every layer in one allocation as vLLM does, otherwise one tensor per layer."""
    per_layer = num_blocks * shape.layer_block_bytes
    raw = torch.randint(-128, 127, (shape.num_layers * per_layer,), dtype=torch.int8)
    dims = (num_blocks, shape.kv_heads, shape.block_size, 2 * shape.head_size * 2)
    caches = {}
    for layer in range(shape.num_layers):
        view = raw[layer * per_layer : (layer + 1) * per_layer].view(dims)
        caches[f"layers.{layer}"] = (view if shared else view.clone()).view(torch.bfloat16)
    return caches


def _copy_op(
    rows: list[torch.Tensor], slices: list[torch.Tensor], *, to_rows: bool
) -> Callable[[int], object]:
    def op(k: int) -> object:
        row, part = rows[k % 32], slices[k % len(slices)]
        return row.copy_(part) if to_rows else part.copy_(row)

    return op


def _paged_op(
    copy: Callable[..., int], ids: list[list[int]], rows: list[torch.Tensor]
) -> Callable[[int], object]:
    def op(k: int) -> object:
        return copy(ids[k % 64], rows[k % 32])

    return op


def fastest(ops: dict[str, Callable[[int], object]], rounds: int = 5) -> dict[str, float]:
    """Seconds per call of each op: the best of `rounds` interleaved ~40 ms trials, so a noisy
    neighbour on the machine slows every op alike instead of one of them."""
    best = dict.fromkeys(ops, float("inf"))
    for op in ops.values():
        op(0)
    for _ in range(rounds):
        for name, op in ops.items():
            count, start = 0, time.perf_counter()
            while (elapsed := time.perf_counter() - start) < 0.04:
                op(count)
                count += 1
            best[name] = min(best[name], elapsed / count)
    return best


def bench_paged(shape: KVShape, cache_mib: int) -> list[tuple[str, float, float, float]]:
    """Per layout and id pattern: (label, copy_ GB/s, gather ratio, scatter ratio)."""
    num_blocks = max(64, cache_mib * MIB // (shape.layer_block_bytes * shape.num_layers))
    n = shape.blocks_per_chunk
    cache_bytes = num_blocks * shape.layer_block_bytes * shape.num_layers
    flat = torch.randint(0, 256, (cache_bytes,), dtype=torch.uint8)  # the copy_ baseline's side
    rng = random.Random(0)
    id_sets = {
        "consecutive ids": [list(range(s, s + n)) for s in rng.sample(range(num_blocks - n), 64)],
        "random ids": [rng.sample(range(num_blocks), n) for _ in range(64)],
    }
    results = []
    layouts = (("one allocation (vLLM CPU)", True), ("separate per-layer tensors", False))
    for layout, shared in layouts:
        caches = cpu_backend_caches(shape, num_blocks, shared=shared)
        view = PagedKVView(caches, num_blocks)
        size = view.buffer_bytes(n)
        slices = [flat[i * size : (i + 1) * size] for i in range(cache_bytes // size)]
        with CPURegion.create(f"bench-tiers-{uuid.uuid4().hex[:8]}", 32, size) as region:
            rows = [region.row_tensor(i) for i in range(32)]
            ops: dict[str, Callable[[int], object]] = {
                "out": _copy_op(rows, slices, to_rows=True),
                "in": _copy_op(rows, slices, to_rows=False),
            }
            for pattern, ids in id_sets.items():
                ops[f"gather {pattern}"] = _paged_op(view.gather, ids, rows)
                ops[f"scatter {pattern}"] = _paged_op(view.scatter, ids, rows)
            times = fastest(ops)
            for pattern in id_sets:
                label = f"{shape.label}, {layout}, {pattern}"
                gather = times["out"] / times[f"gather {pattern}"]
                scatter = times["in"] / times[f"scatter {pattern}"]
                results.append((label, size / times["out"] / 1e9, gather, scatter))
            del rows, ops  # release the row views before the region closes
        del caches, view
    return results


# -- 2. LMDB against raw file I/O --------------------------------------------------------------


def aligned_buffer(size: int) -> mmap.mmap:
    buffer = mmap.mmap(-1, size)
    buffer.write(os.urandom(size))
    return buffer


def buffered_write(directory: Path, values: list[mmap.mmap], batch: int) -> float:
    """Buffered sequential writes with an fdatasync every `batch` values (what a durable
    page-cache writer such as LMDB can hope for); returns GB/s."""
    path = directory / "buffered.bin"
    fd = os.open(path, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o600)
    os.sync()
    start = time.perf_counter()
    for index, value in enumerate(values, 1):
        os.write(fd, value)
        if index % batch == 0 or index == len(values):
            os.fdatasync(fd)
    elapsed = time.perf_counter() - start
    os.close(fd)
    path.unlink()
    return sum(len(v) for v in values) / elapsed / 1e9


def raw_write_read(directory: Path, values: list[mmap.mmap]) -> tuple[float, float, str]:
    """Sequential write then read of `values` to one file; returns (write GB/s, read GB/s, mode)."""
    path = directory / "raw.bin"
    total = sum(len(v) for v in values)
    mode = "O_DIRECT"
    try:
        fd = os.open(path, os.O_CREAT | os.O_WRONLY | os.O_TRUNC | os.O_DIRECT, 0o600)
    except OSError:
        mode = "buffered write + fsync, read after dropping the page cache"
        fd = os.open(path, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o600)
    os.sync()
    start = time.perf_counter()
    for value in values:
        os.write(fd, value)
    os.fsync(fd)
    write_s = time.perf_counter() - start
    os.close(fd)
    flags = os.O_RDONLY | (os.O_DIRECT if mode == "O_DIRECT" else 0)
    fd = os.open(path, flags)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    target = mmap.mmap(-1, len(values[0]))
    start = time.perf_counter()
    for _ in values:
        os.readv(fd, [target])
    read_s = time.perf_counter() - start
    os.close(fd)
    path.unlink()
    return total / write_s / 1e9, total / read_s / 1e9, mode


def drop_page_cache(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


@dataclass(frozen=True)
class Candidate:
    label: str
    options: LMDBOptions
    batch: int


def bench_lmdb_candidate(
    directory: Path, candidate: Candidate, values: list[mmap.mmap], keys: list[bytes]
) -> tuple[float, float, float]:
    """(put GB/s, cold get GB/s, warm get GB/s) for one candidate. Puts are timed in steady
    state, as a full disk tier runs: the store is filled and emptied once first, so the timed
    pass reuses LMDB's free pages instead of growing the file."""
    path = directory / "store"
    total = sum(len(v) for v in values)
    capacity = 2 * total
    items = [(key, memoryview(value)) for key, value in zip(keys, values, strict=True)]
    with LMDBStore.open(path, capacity_bytes=capacity, options=candidate.options) as store:
        store.register_namespace("bench", {"candidate": candidate.label})
        for i in range(0, len(items), candidate.batch):
            store.put_many("bench", items[i : i + candidate.batch])
        store.delete_many("bench", keys)
        os.sync()  # start from no write-back debt (ours or a previous candidate's)
        start = time.perf_counter()
        for i in range(0, len(items), candidate.batch):
            store.put_many("bench", items[i : i + candidate.batch])
        put_s = time.perf_counter() - start
    drop_page_cache(path / "data.mdb")
    out = memoryview(bytearray(len(values[0])))
    read_s = []
    with LMDBStore.open(path, capacity_bytes=capacity, options=candidate.options) as store:
        for _ in range(2):  # cold, then warm (page cache)
            start = time.perf_counter()
            for key in keys:
                store.get_into("bench", key, out)
            read_s.append(time.perf_counter() - start)
    shutil.rmtree(path)
    return total / put_s / 1e9, total / read_s[0] / 1e9, total / read_s[1] / 1e9


_WRITEMAP = LMDBOptions(writemap=True)

CANDIDATES = [
    Candidate("writemap, sync, no metasync", _WRITEMAP, 4),
    Candidate("  same, batch 1", _WRITEMAP, 1),
    Candidate("  same, batch 16", _WRITEMAP, 16),
    Candidate("  same, no readahead", LMDBOptions(writemap=True, readahead=False), 4),
    Candidate("writemap, sync, metasync", LMDBOptions(writemap=True, metasync=True), 4),
    Candidate("no writemap, sync, no metasync (default)", LMDBOptions(), 4),
    Candidate("no writemap, sync, metasync (LMDB's own)", LMDBOptions(metasync=True), 4),
    Candidate(
        "writemap, map_async (no durable commit)", LMDBOptions(writemap=True, map_async=True), 4
    ),
    Candidate("writemap, no sync (no durable commit)", LMDBOptions(writemap=True, sync=False), 4),
]


@contextlib.contextmanager
def bench_directory(parent: str | None) -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="kvstore-bench-", dir=parent))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def run_lmdb(parent: str | None, total_mib: int, value_mib: int, repeats: int) -> None:
    num_values = max(4, total_mib // value_mib)
    values = [aligned_buffer(value_mib * MIB) for _ in range(num_values)]
    keys = [os.urandom(32) for _ in values]
    with bench_directory(parent) as directory:
        print(f"\nLMDB vs raw file I/O: {num_values} values of {value_mib} MiB in {directory}; "
              f"{repeats} interleaved rounds, median and best")  # fmt: skip
        bench_lmdb_candidate(directory, CANDIDATES[0], values, keys)  # warm up the filesystem
        raws, buffered = [], []
        runs: dict[str, list[tuple[float, float, float]]] = {c.label: [] for c in CANDIDATES}
        rng = random.Random(1)
        for _ in range(repeats):  # shuffled rounds, so a noisy spell hits every candidate alike
            raws.append(raw_write_read(directory, values))
            buffered.append(buffered_write(directory, values, 4))
            for candidate in rng.sample(CANDIDATES, len(CANDIDATES)):
                runs[candidate.label].append(
                    bench_lmdb_candidate(directory, candidate, values, keys)
                )
        raw_write, raw_read = max(r[0] for r in raws), max(r[1] for r in raws)
        print(f"raw sequential ({raws[0][2]}): write {_spread([r[0] for r in raws])} GB/s, "
              f"read {_spread([r[1] for r in raws])} GB/s")  # fmt: skip
        print(f"buffered write + fdatasync every 4 values: {_spread(buffered)} GB/s")
        print(f"{'candidate':44} {'batch':>5} {'put GB/s':>11} {'ratio':>6} "
              f"{'cold get GB/s':>13} {'ratio':>6} {'warm get':>9}")  # fmt: skip
        for candidate in CANDIDATES:
            puts, colds, warms = ([r[i] for r in runs[candidate.label]] for i in range(3))
            print(f"{candidate.label:44} {candidate.batch:>5} {_spread(puts):>11} "
                  f"{max(puts) / raw_write:>6.2f} {_spread(colds):>13} "
                  f"{max(colds) / raw_read:>6.2f} {statistics.median(warms):>9.2f}")  # fmt: skip
        print("ratios: best LMDB / best raw")


def _spread(samples: list[float]) -> str:
    return f"{statistics.median(samples):.2f}/{max(samples):.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", default="/var/tmp", help="directory on the disk to test")
    parser.add_argument("--lmdb-mib", type=int, default=128, help="MiB per LMDB candidate")
    parser.add_argument("--value-mib", type=int, default=4, help="size of one value (a chunk row)")
    parser.add_argument("--cache-mib", type=int, default=512, help="size of the KV cache")
    parser.add_argument("--repeats", type=int, default=5, help="LMDB rounds per candidate")
    parser.add_argument(
        "--threads", type=int, default=1,
        help="torch intra-op threads for every copy (1: stable on a small shared machine)",
    )  # fmt: skip
    parser.add_argument("--skip-lmdb", action="store_true")
    parser.add_argument("--skip-paged", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {os.cpu_count()} CPUs")
    if not args.skip_paged:
        print(
            f"\nPagedKVView vs one contiguous copy_ of the same bytes "
            f"(KV cache {args.cache_mib} MiB)"
        )
        print(f"{'case':64} {'copy_ GB/s':>10} {'gather':>7} {'scatter':>8}")
        for shape in SHAPES:
            for label, base, gather, scatter in bench_paged(shape, args.cache_mib):
                print(f"{label:64} {base:>10.1f} {gather:>7.2f} {scatter:>8.2f}")
    if not args.skip_lmdb:
        run_lmdb(args.dir, args.lmdb_mib, args.value_mib, args.repeats)


if __name__ == "__main__":
    main()
