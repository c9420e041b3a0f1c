"""`LMDBStore`: the persistent disk tier, one LMDB environment per store directory.

**Layout.** Five named databases (a fixed set, so no `max_dbs` limit on namespaces):

    store       b"format" -> msgpack {format_version, created_s}; b"capacity_bytes" -> msgpack int;
                b"next_ordinal" -> u32
    namespaces  namespace id (UTF-8) -> msgpack {ordinal, descriptor}
    counts      ordinal (u32 BE) -> num_entries u64, used_bytes u64   (O(1) accounting)
    data        ordinal (u32 BE) + key -> value (one chunk row)
    meta        ordinal (u32 BE) + key -> `EntryMeta.pack()`: size u64, xxh64 u64, created f64,
                last access f64, hits u32

Keys of one namespace are contiguous, so scans are range scans. Namespace records are read in
the same transaction as the data they govern, so a namespace deleted and re-registered by another
process is never confused with the old one. Descriptors are msgpack
(no format that runs code on load).

**Durability.** Defaults `writemap=False, sync=True, metasync=False, map_async=False,
readahead=True`, chosen from `benchmarks/bench_tiers.py` (results in `benchmarks/README.md`) and
the reliability suite (`python -m reliability`): every commit is flushed (fdatasync of the data
pages) before `put_many` returns, but the meta page is not synced separately, which LMDB
documents as keeping the tree intact (a power loss can only undo the last commit). A killed
process (SIGKILL) loses nothing committed with any setting: the pages are already in the
kernel's page cache. `writemap` (values written straight into the shared map) measured ~25%
faster puts and 35-50% less writer CPU while the file grows, but it is off by default: on a full
filesystem a store into a mapped page no disk block backs is SIGBUS. With it, every write
transaction first allocates the disk blocks of the pages it can touch (`tiers._lmdb_reserve`)
and raises `StoreNoSpaceError` when the filesystem has no room, so only a filesystem that fails
a store into an allocated block (copy-on-write ones, on overwrite) can still kill the writer;
kvstore turns it on only in its disk-writer process, never in the engine's. Without it a full
disk fails the commit with `StoreIOError` and the store stays intact. A separate meta sync
measured no difference; `sync=False` or `map_async` doubled put throughput but a power loss
could then corrupt the tree, so they stay off. `readahead` makes cold 4 MiB reads ~20x faster.
A put that would overflow the map grows it (at most to `4 * capacity_bytes + 1 GiB`); if that
is impossible it raises `StoreFullError`, never crashes.

**Damage.** Records that cannot be decoded raise `StoreDamagedError`; LMDB errors inside a
transaction (a full or failing disk, a damaged page) raise `StoreIOError`; a data file truncated
or replaced under an open store is refused before LMDB maps past its end (see `tiers._lmdb_env`).
A namespace is read only while the ordinal it owns is beyond doubt: no other registration claims
it, every other registration names its own, and no entry is stored under an ordinal nobody
claims (`_lmdb_records.namespace_record`); otherwise one model's chunks, checksums intact, could
be served as another's.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

import lmdb
import msgspec

from tiers import _lmdb_env, _lmdb_reads, _lmdb_records
from tiers._lmdb_env import LMDBOptions, SharedEnv
from tiers._lmdb_records import FORMAT_VERSION
from tiers._lmdb_reserve import pages_bytes
from tiers.errors import (
    CorruptionError,
    NamespaceError,
    StoreFullError,
    TierConfigError,
    TierError,
)
from tiers.store import (
    EntryMeta,
    NamespaceStats,
    StoreStats,
    Value,
    WritableBuffer,
    check_key,
    check_namespace,
    hex_prefix_bytes,
    normalize_descriptor,
    prepare_items,
)

__all__ = ["FORMAT_VERSION", "LMDBOptions", "LMDBStore"]

logger = logging.getLogger(__name__)

_GIB = 1 << 30


def default_map_size_bytes(capacity_bytes: int) -> int:
    """Twice the capacity plus 256 MiB: room for LMDB's page overhead, copy-on-write and pages
    that readers still see."""
    return 2 * capacity_bytes + (256 << 20)


class LMDBStore:
    """A checksummed chunk store in one LMDB environment (layout: see the module docstring).

    Threading: any thread may read (`get_into`, `contains`, `meta`, scans, `stats`); exactly ONE
    thread may write (`register_namespace`, `put_many`, `touch_many`, `delete_*`), and the caller
    (the tier service) guarantees it with a single-thread executor. Other processes (a CLI) may
    open the same store at the same time: LMDB readers never block the writer, and `lock=True`
    makes writers in different processes safe too. Stores opened on one path in one process share
    one environment (LMDB forbids opening it twice). Scans read in batches of short
    transactions, so a long scan never pins old pages.
    """

    def __init__(self, shared: SharedEnv, capacity_bytes: int, *, is_readonly: bool) -> None:
        self._shared: SharedEnv | None = shared
        self._capacity_bytes = capacity_bytes
        self.is_readonly = is_readonly
        self.path = shared.path

    @classmethod
    def open(
        cls,
        path: str | os.PathLike[str],
        *,
        capacity_bytes: int | None = None,
        readonly: bool = False,
        create: bool = True,
        map_size_bytes: int | None = None,
        options: LMDBOptions | None = None,
    ) -> LMDBStore:
        """Open (or create, mode 0700/0600) the store at directory `path`.

        `capacity_bytes` bounds the sum of value sizes; required unless `readonly`, where it
        defaults to the capacity the last writer recorded. Raises TierConfigError for a bad path,
        NamespaceError for an incompatible format version.
        """
        if not readonly and (capacity_bytes is None or capacity_bytes <= 0):
            raise TierConfigError(
                f"capacity_bytes must be a positive int for a writable store, got {capacity_bytes}"
            )
        store_path = _lmdb_env.check_store_path(Path(path), create=create, readonly=readonly)
        map_size = map_size_bytes or default_map_size_bytes(capacity_bytes or 0)
        if readonly and map_size_bytes is None:  # a writer's map (writemap sizes the file to it)
            map_size = max(map_size, (store_path / "data.mdb").stat().st_size)
        shared = _lmdb_env.acquire(
            store_path, readonly=readonly, options=options or LMDBOptions(), map_size_bytes=map_size
        )
        try:
            recorded = _lmdb_records.check_format(shared, capacity_bytes, readonly=readonly)
        except BaseException:
            _lmdb_env.release(shared)
            raise
        return cls(shared, capacity_bytes or recorded, is_readonly=readonly)

    @property
    def capacity_bytes(self) -> int:
        return self._capacity_bytes

    @property
    def options(self) -> LMDBOptions:
        """The environment's options (those it was first opened with in this process)."""
        return self._env().options

    # -- namespaces ---------------------------------------------------------------------------

    def register_namespace(self, namespace: str, descriptor: Mapping[str, Any]) -> None:
        """Register `namespace` (idempotent); a different descriptor raises NamespaceError."""
        name = check_namespace(namespace)
        normalized = normalize_descriptor(descriptor)
        with self._write_txn() as txn:
            shared = self._env()
            stored = _lmdb_records.namespace_record(txn, shared, namespace)
            if stored is not None:
                if stored.descriptor != normalized:
                    raise NamespaceError(
                        f"namespace {namespace!r} is registered with a different descriptor: "
                        f"stored {stored.descriptor}, given {normalized}"
                    )
                return
            ordinal = _lmdb_records.next_free_ordinal(txn, shared)
            store_db = shared.dbs[b"store"]
            next_ordinal = min(ordinal + 1, _lmdb_records.MAX_ORDINAL)
            txn.put(b"next_ordinal", _lmdb_records.ORDINAL.pack(next_ordinal), db=store_db)
            record = {"ordinal": ordinal, "descriptor": normalized}
            txn.put(name, msgspec.msgpack.encode(record), db=shared.dbs[b"namespaces"])
        logger.info("registered namespace %r in %s", namespace, self.path)

    def namespaces(self) -> dict[str, dict[str, Any]]:
        """Every namespace's descriptor; StoreDamagedError if a registration is damaged."""
        with self._read_txn() as txn:
            records = _lmdb_records.all_namespaces(txn, self._env())
        return {record.name: record.descriptor for record in records}

    # -- writes (one writer thread) ----------------------------------------------------------

    def put_many(
        self, namespace: str, items: Sequence[tuple[bytes, Value]], *, now_s: float | None = None
    ) -> int:
        """Write `items` in ONE transaction (the last value of a repeated key wins); returns the
        bytes written. Raises StoreFullError, writing nothing, if capacity would be exceeded."""
        prepared = prepare_items(items)
        now = time.time() if now_s is None else now_s
        for attempt in range(4):
            try:
                return self._put_txn(namespace, prepared, now)
            except lmdb.MapFullError as exc:
                if attempt == 3 or not self._grow_map():
                    info = self._env().env.info()
                    raise StoreFullError(
                        f"LMDB map of {info['map_size']} bytes at {self.path} is full; evict "
                        "entries or open the store with a larger map_size_bytes",
                        requested_bytes=sum(view.nbytes for view, _ in prepared.values()),
                        free_bytes=0,
                    ) from exc
        raise AssertionError("unreachable")  # pragma: no cover

    def _put_txn(
        self, namespace: str, prepared: dict[bytes, tuple[memoryview, int]], now_s: float
    ) -> int:
        shared = self._env()
        data_db, meta_db = shared.dbs[b"data"], shared.dbs[b"meta"]
        psize = shared.page_bytes
        new_bytes = sum(pages_bytes(view.nbytes, psize) for view, _ in prepared.values())
        with self._write_txn(new_bytes=new_bytes) as txn:
            ordinal = _lmdb_records.ordinal(txn, shared, namespace)
            prefix = _lmdb_records.ORDINAL.pack(ordinal)
            num_new, delta_bytes = 0, 0
            for key, (view, _) in prepared.items():
                old = txn.get(prefix + key, db=meta_db)
                num_new += old is None
                if old is not None:
                    delta_bytes -= _lmdb_records.stored_size(txn, shared, prefix + key, old)
                delta_bytes += view.nbytes
            used = _lmdb_records.total_used(txn, shared)
            free = self._capacity_bytes - used
            if delta_bytes > free:
                raise StoreFullError(
                    f"putting {len(prepared)} entries needs {delta_bytes} more bytes; {free} of "
                    f"{self._capacity_bytes} are free in {self.path}",
                    requested_bytes=delta_bytes,
                    free_bytes=free,
                )
            for key, (view, value_checksum) in prepared.items():
                entry = EntryMeta(namespace, key, view.nbytes, value_checksum, now_s, now_s, 0)
                txn.put(prefix + key, view, db=data_db)
                txn.put(prefix + key, entry.pack(), db=meta_db)
            _lmdb_records.add_counts(txn, shared, prefix, num_new, delta_bytes)
        return sum(view.nbytes for view, _ in prepared.values())

    def touch_many(
        self, namespace: str, keys: Sequence[bytes], *, now_s: float | None = None
    ) -> None:
        """Record a hit (last access time, hit count) for each present key; one transaction."""
        now = time.time() if now_s is None else now_s
        shared = self._env()
        meta_db = shared.dbs[b"meta"]
        with self._write_txn() as txn:
            prefix = _lmdb_records.prefix(txn, shared, namespace)
            for key in keys:
                raw = txn.get(prefix + check_key(key), db=meta_db)
                if raw is None:
                    continue
                try:
                    entry = _lmdb_records.parse_meta(namespace, key, raw)
                except CorruptionError:
                    continue  # the next read finds it corrupt and deletes it
                touched = EntryMeta(
                    namespace, key, entry.size_bytes, entry.checksum, entry.created_s, now,
                    entry.num_hits + 1,
                )  # fmt: skip
                txn.put(prefix + key, touched.pack(), db=meta_db)

    def delete_many(self, namespace: str, keys: Sequence[bytes]) -> int:
        """Delete the present keys in one transaction; returns how many were deleted."""
        shared = self._env()
        num_deleted, freed_bytes = 0, 0
        with self._write_txn() as txn:
            prefix = _lmdb_records.prefix(txn, shared, namespace)
            for key in dict.fromkeys(keys):
                full_key = prefix + check_key(key)
                raw = txn.pop(full_key, db=shared.dbs[b"meta"])
                size = 0 if raw is None else _lmdb_records.stored_size(txn, shared, full_key, raw)
                has_data = txn.delete(full_key, db=shared.dbs[b"data"])
                if raw is None and not has_data:
                    continue
                num_deleted += 1
                freed_bytes += 0 if raw is None else size
            _lmdb_records.add_counts(txn, shared, prefix, -num_deleted, -freed_bytes)
        return num_deleted

    def delete_namespace(self, namespace: str) -> int:
        """Delete every entry of `namespace` and its registration, atomically; returns the
        number of entries deleted."""
        shared = self._env()
        with self._write_txn() as txn:
            prefix = _lmdb_records.prefix(txn, shared, namespace)
            num_deleted = 0
            for name in (b"data", b"meta"):
                cursor = txn.cursor(db=shared.dbs[name])
                found = cursor.set_range(prefix)
                while found and bytes(cursor.key()).startswith(prefix):
                    num_deleted += name == b"meta"
                    found = cursor.delete()
            txn.delete(prefix, db=shared.dbs[b"counts"])
            txn.delete(namespace.encode(), db=shared.dbs[b"namespaces"])
        logger.info("deleted namespace %r (%d entries) from %s", namespace, num_deleted, self.path)
        return num_deleted

    # -- reads (any thread) -------------------------------------------------------------------

    def get_into(self, namespace: str, key: bytes, out: WritableBuffer) -> int | None:
        """Copy the value of `key` into `out` (zero-copy from the map) and verify its checksum.

        Returns the size, or None if absent. Raises CorruptionError on a checksum or size
        mismatch (the bytes in `out` must then be ignored). Does not update the entry's meta.
        """
        return _lmdb_reads.read_into(self._env(), namespace, key, out)

    def get_many_into(
        self, namespace: str, items: Sequence[tuple[bytes, WritableBuffer]]
    ) -> list[int | CorruptionError | None]:
        """`get_into` for many keys in ONE read transaction (see `BlockStore.get_many_into`).

        One transaction and one pass keep the reader thread from handing the GIL back and forth
        per key while vLLM's step loop runs (each hand-back can cost a switch interval)."""
        return _lmdb_reads.read_many_into(self._env(), namespace, items)

    def contains(self, namespace: str, key: bytes) -> bool:
        return self.meta(namespace, key) is not None

    def meta(self, namespace: str, key: bytes) -> EntryMeta | None:
        shared = self._env()
        with self._read_txn() as txn:
            full_key = _lmdb_records.ORDINAL.pack(
                _lmdb_records.ordinal(txn, shared, namespace)
            ) + check_key(key)
            raw = txn.get(full_key, db=shared.dbs[b"meta"])
        return None if raw is None else _lmdb_records.parse_meta(namespace, key, raw)

    def iter_meta(self, namespace: str) -> Iterator[EntryMeta]:
        """Every entry's meta in key order, read in short batched transactions."""
        for key, raw in _lmdb_records.scan(self._env(), namespace, b""):
            yield _lmdb_records.parse_meta(namespace, key, raw)

    def iter_keys(self, namespace: str) -> Iterator[bytes]:
        for key, _ in _lmdb_records.scan(self._env(), namespace, b""):
            yield key

    def find_keys(
        self, namespace: str, hex_prefix: str, *, limit: int | None = None
    ) -> list[bytes]:
        """Keys whose hex form starts with `hex_prefix` (case-insensitive), in key order."""
        wanted = hex_prefix.lower()
        found: list[bytes] = []
        for key, _ in _lmdb_records.scan(self._env(), namespace, hex_prefix_bytes(hex_prefix)):
            if key.hex().startswith(wanted):
                found.append(key)
                if limit is not None and len(found) >= limit:
                    break
        return found

    def stats(self) -> StoreStats:
        shared = self._env()
        with self._read_txn() as txn:
            names = {r.ordinal: r.name for r in _lmdb_records.all_namespaces(txn, shared)}
            counts = _lmdb_records.counts(txn, shared)
            map_size = shared.env.info()["map_size"]
        per_namespace = {
            name: NamespaceStats(*counts.get(ordinal, (0, 0))) for ordinal, name in names.items()
        }
        data_file = os.stat(self.path / "data.mdb")
        return StoreStats(
            num_entries=sum(s.num_entries for s in per_namespace.values()),
            used_bytes=sum(s.used_bytes for s in per_namespace.values()),
            capacity_bytes=self._capacity_bytes,
            file_bytes=min(data_file.st_size, data_file.st_blocks * 512),
            map_size_bytes=map_size,
            namespaces=per_namespace,
        )

    # -- lifecycle ----------------------------------------------------------------------------

    def sync(self) -> None:
        """Flush committed data to disk (a no-op for a read-only store)."""
        if not self.is_readonly:
            self._env().env.sync(True)

    def close(self) -> None:
        """Release the environment (closed when its last store in this process closes)."""
        shared, self._shared = self._shared, None
        if shared is not None:
            _lmdb_env.release(shared)

    def __enter__(self) -> LMDBStore:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._shared is None else ("read-only" if self.is_readonly else "open")
        return f"LMDBStore({str(self.path)!r}, capacity_bytes={self._capacity_bytes}, {state})"

    # -- internals ----------------------------------------------------------------------------

    def _env(self) -> SharedEnv:
        if self._shared is None:
            raise TierError(f"LMDB store {self.path} is closed")
        return self._shared

    def _write_txn(
        self, *, new_bytes: int = 0
    ) -> contextlib.AbstractContextManager[lmdb.Transaction[bytes]]:
        if self.is_readonly:
            raise TierConfigError(f"LMDB store {self.path} was opened read-only")
        return self._env().write_txn(new_bytes=new_bytes)

    def _read_txn(
        self, *, buffers: bool = False
    ) -> contextlib.AbstractContextManager[lmdb.Transaction[Any]]:
        return self._env().read_txn(buffers=buffers)

    def _grow_map(self) -> bool:
        return self._env().grow_map(4 * self._capacity_bytes + _GIB)
