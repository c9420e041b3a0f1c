"""`LMDBSource`: a store directory as a `ChunkSource`.

Opened read-only: LMDB readers never block a live engine writing the store, and the store's
scans read in short batched transactions. `for_writing()` closes it and reopens the store with
the capacity and map size the engine recorded, so a delete changes nothing but what it deletes.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from kvstore.cli._chunks import ChunkMeta, ChunkRead
from kvstore.cli._common import open_store
from kvstore.cli._describe import NO_LAYOUT_REASON
from kvstore.cli._reading import ChunkReader
from kvstore.cli._source import ChunkSource
from tiers.lmdb import LMDBStore

__all__ = ["LMDBSource", "open_lmdb_source"]


class LMDBSource:
    """One open `LMDBStore` (see the module docstring)."""

    no_layout_reason = NO_LAYOUT_REASON

    def __init__(self, store: LMDBStore) -> None:
        self._store = store
        self._reader = ChunkReader(store)

    @property
    def location(self) -> str:
        return str(self._store.path)

    def where(self) -> dict[str, str]:
        return {"path": str(self._store.path)}

    def summary(self) -> dict[str, Any]:
        """Occupancy from the store's O(1) counters."""
        stats = self._store.stats()
        capacity = stats.capacity_bytes
        return {
            "backend": "lmdb",
            "num_entries": stats.num_entries,
            "used_bytes": stats.used_bytes,
            "capacity_bytes": capacity,
            "free_bytes": stats.free_bytes,
            "fill_ratio": round(stats.used_bytes / capacity, 6) if capacity else None,
            "file_bytes": stats.file_bytes,
            "map_size_bytes": stats.map_size_bytes,
        }

    def namespaces(self) -> dict[str, Mapping[str, Any]]:
        return dict(self._store.namespaces())

    def num_chunks(self, namespaces: Sequence[str]) -> int:
        counts = self._store.stats().namespaces
        return sum(counts[n].num_entries for n in namespaces if n in counts)

    def iter_meta(self, namespace: str) -> Iterator[ChunkMeta]:
        for meta in self._store.iter_meta(namespace):
            yield ChunkMeta.from_entry(meta)

    def iter_keys(self, namespace: str) -> Iterator[bytes]:
        return self._store.iter_keys(namespace)

    def find_keys(self, namespace: str, prefix: str, limit: int) -> list[bytes]:
        return self._store.find_keys(namespace, prefix, limit=limit)

    def meta(self, namespace: str, key: bytes) -> ChunkMeta | None:
        meta = self._store.meta(namespace, key)
        return None if meta is None else ChunkMeta.from_entry(meta)

    def read_many(self, namespace: str, keys: Iterable[bytes]) -> Iterator[ChunkRead]:
        for key in keys:
            yield self._reader.read(namespace, key)

    def delete_many(self, namespace: str, keys: Sequence[bytes]) -> int:
        return self._store.delete_many(namespace, keys)

    def delete_namespace(self, namespace: str) -> int:
        return self._store.delete_namespace(namespace)

    def totals(self) -> tuple[int, int]:
        stats = self._store.stats()
        return stats.num_entries, stats.used_bytes

    @contextmanager
    def for_writing(self) -> Iterator[ChunkSource]:
        path = self._store.path
        self._store.close()  # one process may not hold a path read-only and writable at once
        with open_store(path, writable=True) as writable:
            yield LMDBSource(writable)


@contextmanager
def open_lmdb_source(path: Path) -> Iterator[LMDBSource]:
    """The store at `path`, read-only (see `open_store` for the errors)."""
    with open_store(path) as store:
        yield LMDBSource(store)
