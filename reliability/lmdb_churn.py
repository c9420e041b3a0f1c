"""Churn an `LMDBStore` through its public API with concurrent readers; count false findings.

One writer commits random puts, overwrites, deletes and touches (as the tier service's writer
does); reader threads call `get_into` on random keys all the while (as its reader pool does).
Every transaction runs the store's data-file check, so a healthy store declared truncated shows
up as a `StoreIOError` on some read or write. After every commit the writer also records
whether the file was *short* (shorter than LMDB's last allocated page implies, which a healthy
file is after some commits: see `tiers._lmdb_pages`), so a run proves it reached the case that
used to be misread. With `writer_process=True` the writer runs in another process (spawned) and
the readers here check the file that process grows.

`python -m reliability.lmdb_churn --seeds 10 --commits 10000 [--writer-process] [--writemap]`
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import random
import sys
import tempfile
import threading
from dataclasses import asdict, dataclass, field
from pathlib import Path

from tiers import LMDBOptions, TierError
from tiers._lmdb_pages import newest_meta
from tiers.lmdb import LMDBStore

__all__ = ["ChurnResult", "churn"]

NAMESPACE = "churn"
_CAPACITY_BYTES = 1 << 30
_KEY_POOL = 4000


@dataclass(slots=True)
class ChurnResult:
    seed: int
    num_commits: int = 0
    num_short: int = 0
    """Commits after which the file was shorter than its last allocated page implies."""
    num_reads: int = 0
    num_hits: int = 0
    findings: list[str] = field(default_factory=list)
    """StoreIOErrors and other store errors met by the writer or a reader (want none)."""


def _value(rng: random.Random) -> bytes:
    return rng.randbytes(rng.choice((200, 200, 1500, 5000, 70000)))


def _commit(store: LMDBStore, rng: random.Random, keys: list[bytes], cluster: list[bytes]) -> None:
    """One write transaction of a random kind. A *cluster* (keys adjacent in key order, put in
    one transaction and deleted in another) empties whole leaf pages: LMDB then merges pages it
    copied earlier in the same transaction, which leaves loose pages."""
    kind = rng.random()
    if kind < 0.08:
        if cluster:
            store.delete_many(NAMESPACE, cluster)
            cluster.clear()
        else:
            prefix = rng.randbytes(12)
            cluster.extend(prefix + i.to_bytes(4, "big") for i in range(rng.choice((100, 400))))
            store.put_many(NAMESPACE, [(key, rng.randbytes(200)) for key in cluster])
    elif kind < 0.45 or len(keys) < 20:
        batch = [(rng.choice(keys) if keys and rng.random() < 0.3 else rng.randbytes(16))
                 for _ in range(rng.choice((1, 4, 12, 60)))]  # fmt: skip
        store.put_many(NAMESPACE, [(key, _value(rng)) for key in batch])
        keys.extend(key for key in dict.fromkeys(batch) if key not in keys)
        del keys[: max(0, len(keys) - _KEY_POOL)]
    elif kind < 0.75:
        doomed = rng.sample(keys, min(len(keys), rng.choice((1, 3, 40, 150, 400))))
        store.delete_many(NAMESPACE, doomed)
        for key in doomed:
            keys.remove(key)
    else:
        store.touch_many(NAMESPACE, rng.sample(keys, min(len(keys), rng.randint(1, 30))))


def _is_short(data_file: Path) -> bool:
    fd = os.open(data_file, os.O_RDONLY)
    try:
        meta = newest_meta(fd)
        return meta is not None and os.fstat(fd).st_size < meta.needed_bytes
    finally:
        os.close(fd)


def _write(path: Path, seed: int, num_commits: int, options: LMDBOptions,
           shared_keys: list[bytes] | None) -> ChurnResult:  # fmt: skip
    result = ChurnResult(seed)
    rng = random.Random(seed)
    keys: list[bytes] = []
    cluster: list[bytes] = []
    with LMDBStore.open(path, capacity_bytes=_CAPACITY_BYTES, options=options) as store:
        store.register_namespace(NAMESPACE, {"churn": True})
        for _ in range(num_commits):
            try:
                _commit(store, rng, keys, cluster)
            except TierError as exc:
                result.findings.append(f"writer: {type(exc).__name__}: {exc}")
                break
            result.num_commits += 1
            result.num_short += _is_short(path / "data.mdb")
            if shared_keys is not None:
                shared_keys[:] = keys
    return result


def _read(store: LMDBStore, keys: list[bytes], stop: threading.Event, seed: int,
          result: ChurnResult, lock: threading.Lock) -> None:  # fmt: skip
    rng = random.Random(seed)
    out = bytearray(70000)
    num_reads = num_hits = 0
    while not stop.is_set():
        snapshot = keys[:]  # the writer replaces the list's items; a copy is enough
        if not snapshot:
            stop.wait(0.001)
            continue
        try:
            num_hits += store.get_into(NAMESPACE, rng.choice(snapshot), out) is not None
        except TierError as exc:
            with lock:
                result.findings.append(f"reader: {type(exc).__name__}: {exc}")
            return
        num_reads += 1
    with lock:
        result.num_reads += num_reads
        result.num_hits += num_hits


def _writer_child(path: str, seed: int, num_commits: int, writemap: bool) -> ChurnResult:
    return _write(Path(path), seed, num_commits, LMDBOptions(writemap=writemap), None)


def churn(path: Path, seed: int, num_commits: int, *, num_readers: int = 2,
          writemap: bool = False, writer_process: bool = False) -> ChurnResult:  # fmt: skip
    """Run one churn on a new store at `path`; see the module docstring. `writemap` is the
    writer's; with `writer_process` the readers' process opens the store without it, as the
    engine does beside kvstore's disk-writer process."""
    options = LMDBOptions(writemap=writemap)
    readers_options = LMDBOptions() if writer_process else options
    keys: list[bytes] = []
    if writer_process:
        with LMDBStore.open(path, capacity_bytes=_CAPACITY_BYTES, options=readers_options) as made:
            made.register_namespace(NAMESPACE, {"churn": True})
    store = LMDBStore.open(path, capacity_bytes=_CAPACITY_BYTES, options=readers_options)
    stop, lock = threading.Event(), threading.Lock()
    readers_result = ChurnResult(seed)
    threads = [
        threading.Thread(
            target=_read, args=(store, keys, stop, seed * 100 + i, readers_result, lock)
        )
        for i in range(num_readers)
    ]
    for thread in threads:
        thread.start()
    try:
        result = _run_writer(path, store, seed, num_commits, options, keys, writer_process)
    finally:
        stop.set()
        for thread in threads:
            thread.join()
        store.close()
    result.num_reads, result.num_hits = readers_result.num_reads, readers_result.num_hits
    result.findings += readers_result.findings
    return result


def _run_writer(path: Path, store: LMDBStore, seed: int, num_commits: int, options: LMDBOptions,
                keys: list[bytes], writer_process: bool) -> ChurnResult:  # fmt: skip
    if not writer_process:
        return _write(path, seed, num_commits, options, keys)
    context = multiprocessing.get_context("spawn")
    with context.Pool(1) as pool:
        pending = pool.apply_async(_writer_child, (str(path), seed, num_commits, options.writemap))
        findings: list[str] = []
        while not pending.ready():  # readers here read what the child wrote, by key
            try:
                keys[:] = [entry.key for entry in store.iter_meta(NAMESPACE)][:_KEY_POOL]
            except TierError as exc:
                findings.append(f"lister: {type(exc).__name__}: {exc}")
                keys.clear()
            pending.wait(0.05)
        result: ChurnResult = pending.get()
        result.findings += findings[:1]
        return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m reliability.lmdb_churn", description=__doc__)
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--commits", type=int, default=10000)
    parser.add_argument("--readers", type=int, default=2)
    parser.add_argument("--writemap", action="store_true")
    parser.add_argument("--writer-process", action="store_true")
    args = parser.parse_args(argv)
    failed = False
    for seed in range(1, args.seeds + 1):
        with tempfile.TemporaryDirectory(prefix="kvstore-churn-") as tmp:
            result = churn(Path(tmp) / "store", seed, args.commits, num_readers=args.readers,
                           writemap=args.writemap, writer_process=args.writer_process)  # fmt: skip
        failed |= bool(result.findings) or result.num_commits < args.commits
        print(json.dumps(asdict(result)), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
