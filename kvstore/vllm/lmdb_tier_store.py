"""`LMDBTier`'s start: opening the store (`open_tier_store`), rebuilding the disk index from what
it holds (`seeded_index`), and vLLM's primary CPU tier as rows (`PrimarySlots`).

Everything here runs once, on vLLM's scheduler thread, before any I/O thread exists; afterwards
the store belongs to kvstore's `TierService` and the index to `LMDBTier`.
"""

from __future__ import annotations

import logging

from kvstore.errors import ConfigError
from kvstore.index.disk import DiskIndex
from kvstore.index.event_log import EventLog
from kvstore.index.plans import SeedEntry
from kvstore.keys import BlockKey
from kvstore.namespace import NamespaceDescriptor, namespace_id
from kvstore.vllm.lmdb_tier_options import LMDBTierOptions
from tiers.errors import TierError
from tiers.lmdb import LMDBStore

__all__ = ["PrimarySlots", "open_tier_store", "seeded_index"]

logger = logging.getLogger(__name__)


def open_tier_store(
    options: LMDBTierOptions, descriptor: NamespaceDescriptor, slot_bytes: int
) -> LMDBStore:
    """Open (or create) the store and register the tier's namespace in it."""
    if options.capacity_bytes < slot_bytes:
        raise ConfigError(
            f"LMDBTier option 'capacity_bytes': {options.capacity_bytes} bytes is smaller than "
            f"one chunk ({slot_bytes} bytes)"
        )
    try:
        store = LMDBStore.open(options.path, capacity_bytes=options.capacity_bytes)
    except (TierError, OSError) as exc:
        raise ConfigError(
            f"LMDBTier option 'path': cannot open an LMDB store at {options.path}: {exc}"
        ) from exc
    namespace = namespace_id(descriptor)
    try:
        if namespace not in store.namespaces():
            store.register_namespace(namespace, descriptor.to_dict())
    except BaseException:
        store.close()
        raise
    return store


def seeded_index(
    store: LMDBStore, options: LMDBTierOptions, descriptor: NamespaceDescriptor, log: EventLog
) -> DiskIndex:
    """The index over what the store already holds in the namespace (a restart's hits), within
    the capacity the store's other namespaces leave; deletes what does not fit and values that
    are not one slot (this tier never wrote them)."""
    namespace, slot_bytes = namespace_id(descriptor), descriptor.row_bytes
    budget = _budget(store, options, namespace, slot_bytes)
    index = DiskIndex(options.eviction_policy, budget, slot_bytes, log)
    seeds: list[SeedEntry] = []
    doomed: list[BlockKey] = []
    for meta in store.iter_meta(namespace):
        key = BlockKey(meta.key)
        if meta.size_bytes == slot_bytes:
            seeds.append(SeedEntry(key, meta.size_bytes, meta.last_access_s))
        else:
            doomed.append(key)
    doomed += index.seed(seeds)
    if doomed:
        store.delete_many(namespace, doomed)
        logger.info("LMDBTier: deleted %d chunks beyond capacity or of a wrong size", len(doomed))
    return index


def _budget(store: LMDBStore, options: LMDBTierOptions, namespace: str, slot_bytes: int) -> int:
    """The bytes this engine may use: the capacity less what other namespaces hold."""
    stats = store.stats()
    others = stats.used_bytes - stats.namespaces[namespace].used_bytes
    budget = options.capacity_bytes - others
    if budget < slot_bytes:
        raise ConfigError(
            f"LMDBTier option 'capacity_bytes': other namespaces of {store.path} use {others} "
            f"of its {options.capacity_bytes} bytes, leaving less than one chunk ({slot_bytes} "
            f"bytes); raise capacity_bytes or remove them with `kvstore rm --namespace`"
        )
    if others:
        logger.warning(
            "LMDBTier: other namespaces of %s use %d bytes; this engine may use %d",
            store.path, others, budget,
        )  # fmt: skip
    return budget


class PrimarySlots:
    """vLLM's primary CPU tier as rows: slot `c` is `strides[0]` bytes at `c * strides[0]`."""

    def __init__(self, view: memoryview) -> None:
        if view.ndim < 1 or view.strides is None or not view.c_contiguous:
            raise ConfigError(
                f"LMDBTier: the primary KV view must be a C-contiguous [num_slots, slot_bytes] "
                f"buffer, got ndim={view.ndim}, strides={view.strides}"
            )
        self.slot_bytes = int(view.strides[0])
        self.num_slots = int(view.shape[0]) if view.shape else 0
        if self.slot_bytes <= 0 or view.nbytes != self.num_slots * self.slot_bytes:
            raise ConfigError(
                f"LMDBTier: the primary KV view has {view.nbytes} bytes, not "
                f"{self.num_slots} slots x {self.slot_bytes} bytes"
            )
        self._flat = view.cast("B")

    def row(self, index: int) -> memoryview:
        start = index * self.slot_bytes
        return self._flat[start : start + self.slot_bytes]

    def release(self) -> None:
        self._flat.release()
