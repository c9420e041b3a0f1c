"""`MemoryStore`: an in-memory `BlockStore` for tests, with the same contract as `LMDBStore`.

Values are checksummed like on disk, so `corrupt(namespace, key)` can flip a stored byte and the
next read raises `CorruptionError`, exactly as a damaged LMDB value would.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import replace
from types import TracebackType
from typing import Any

from tiers.errors import CorruptionError, NamespaceError, StoreFullError, TierConfigError
from tiers.store import (
    EntryMeta,
    NamespaceStats,
    StoreStats,
    Value,
    WritableBuffer,
    check_key,
    check_namespace,
    checksum,
    hex_prefix_bytes,
    normalize_descriptor,
    prepare_items,
    writable_view,
)

__all__ = ["MemoryStore"]


class _Namespace:
    __slots__ = ("descriptor", "entries", "values")

    def __init__(self, descriptor: dict[str, Any]) -> None:
        self.descriptor = descriptor
        self.values: dict[bytes, bytearray] = {}
        self.entries: dict[bytes, EntryMeta] = {}


class MemoryStore:
    """A `BlockStore` held in a dict. Thread-safe (one lock); `close()` drops nothing."""

    def __init__(self, capacity_bytes: int) -> None:
        if capacity_bytes <= 0:
            raise TierConfigError(f"capacity_bytes must be positive, got {capacity_bytes}")
        self._capacity_bytes = capacity_bytes
        self._lock = threading.Lock()
        self._namespaces: dict[str, _Namespace] = {}
        self._used_bytes = 0

    @property
    def capacity_bytes(self) -> int:
        return self._capacity_bytes

    def register_namespace(self, namespace: str, descriptor: Mapping[str, Any]) -> None:
        check_namespace(namespace)
        normalized = normalize_descriptor(descriptor)
        with self._lock:
            existing = self._namespaces.get(namespace)
            if existing is None:
                self._namespaces[namespace] = _Namespace(normalized)
            elif existing.descriptor != normalized:
                raise NamespaceError(
                    f"namespace {namespace!r} is registered with a different descriptor: "
                    f"stored {existing.descriptor}, given {normalized}"
                )

    def namespaces(self) -> dict[str, dict[str, Any]]:
        with self._lock:
            return {name: dict(ns.descriptor) for name, ns in self._namespaces.items()}

    def put_many(
        self, namespace: str, items: Sequence[tuple[bytes, Value]], *, now_s: float | None = None
    ) -> int:
        prepared = prepare_items(items)
        now = time.time() if now_s is None else now_s
        with self._lock:
            ns = self._get(namespace)
            old_bytes = sum(len(ns.values[k]) for k in prepared if k in ns.values)
            new_bytes = sum(view.nbytes for view, _ in prepared.values())
            delta = new_bytes - old_bytes
            free = self._capacity_bytes - self._used_bytes
            if delta > free:
                raise StoreFullError(
                    f"putting {len(prepared)} entries needs {delta} more bytes; "
                    f"{free} of {self._capacity_bytes} are free",
                    requested_bytes=delta,
                    free_bytes=free,
                )
            for key, (view, value_checksum) in prepared.items():
                ns.values[key] = bytearray(view)
                ns.entries[key] = EntryMeta(
                    namespace, key, view.nbytes, value_checksum, now, now, 0
                )
            self._used_bytes += delta
        return new_bytes

    def get_into(self, namespace: str, key: bytes, out: WritableBuffer) -> int | None:
        target = writable_view(out)
        with self._lock:
            ns = self._get(namespace)
            value = ns.values.get(check_key(key))
            if value is None:
                return None
            entry = ns.entries[key]
            size = len(value)
            if size > target.nbytes:
                raise TierConfigError(f"out has {target.nbytes} bytes; the value has {size}")
            target[:size] = value
        if size != entry.size_bytes or checksum(target[:size]) != entry.checksum:
            raise CorruptionError(
                f"value of key {key.hex()[:16]} in namespace {namespace!r} fails its checksum",
                namespace=namespace,
                key=key,
            )
        return size

    def get_many_into(
        self, namespace: str, items: Sequence[tuple[bytes, WritableBuffer]]
    ) -> list[int | CorruptionError | None]:
        results: list[int | CorruptionError | None] = []
        for key, out in items:
            try:
                results.append(self.get_into(namespace, key, out))
            except CorruptionError as exc:
                results.append(exc)
        return results

    def touch_many(
        self, namespace: str, keys: Sequence[bytes], *, now_s: float | None = None
    ) -> None:
        now = time.time() if now_s is None else now_s
        with self._lock:
            ns = self._get(namespace)
            for key in keys:
                entry = ns.entries.get(check_key(key))
                if entry is not None:
                    ns.entries[key] = replace(entry, last_access_s=now, num_hits=entry.num_hits + 1)

    def delete_many(self, namespace: str, keys: Sequence[bytes]) -> int:
        num_deleted = 0
        with self._lock:
            ns = self._get(namespace)
            for key in dict.fromkeys(keys):
                value = ns.values.pop(check_key(key), None)
                if value is not None:
                    del ns.entries[key]
                    self._used_bytes -= len(value)
                    num_deleted += 1
        return num_deleted

    def delete_namespace(self, namespace: str) -> int:
        with self._lock:
            ns = self._get(namespace)
            del self._namespaces[namespace]
            self._used_bytes -= sum(len(v) for v in ns.values.values())
            return len(ns.values)

    def contains(self, namespace: str, key: bytes) -> bool:
        with self._lock:
            return check_key(key) in self._get(namespace).values

    def meta(self, namespace: str, key: bytes) -> EntryMeta | None:
        with self._lock:
            return self._get(namespace).entries.get(check_key(key))

    def iter_meta(self, namespace: str) -> Iterator[EntryMeta]:
        with self._lock:
            entries = sorted(self._get(namespace).entries.items())
        return iter([entry for _, entry in entries])

    def iter_keys(self, namespace: str) -> Iterator[bytes]:
        with self._lock:
            return iter(sorted(self._get(namespace).values))

    def find_keys(
        self, namespace: str, hex_prefix: str, *, limit: int | None = None
    ) -> list[bytes]:
        hex_prefix_bytes(hex_prefix)
        wanted = hex_prefix.lower()
        found = [key for key in self.iter_keys(namespace) if key.hex().startswith(wanted)]
        return found if limit is None else found[:limit]

    def stats(self) -> StoreStats:
        with self._lock:
            per_namespace = {
                name: NamespaceStats(len(ns.values), sum(len(v) for v in ns.values.values()))
                for name, ns in self._namespaces.items()
            }
            return StoreStats(
                num_entries=sum(s.num_entries for s in per_namespace.values()),
                used_bytes=self._used_bytes,
                capacity_bytes=self._capacity_bytes,
                file_bytes=0,
                map_size_bytes=0,
                namespaces=per_namespace,
            )

    def corrupt(self, namespace: str, key: bytes, *, offset: int = 0) -> None:
        """Flip every bit of the stored byte at `offset` of `key` (a test helper)."""
        with self._lock:
            value = self._get(namespace).values[check_key(key)]
            value[offset] ^= 0xFF

    def sync(self) -> None:
        """Nothing to flush."""

    def close(self) -> None:
        """Nothing to release; the data stays readable (a test double)."""

    def __enter__(self) -> MemoryStore:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def _get(self, namespace: str) -> _Namespace:
        ns = self._namespaces.get(namespace)
        if ns is None:
            raise NamespaceError(
                f"namespace {namespace!r} is not registered; known: {sorted(self._namespaces)}"
            )
        return ns
