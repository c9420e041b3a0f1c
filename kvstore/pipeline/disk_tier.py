"""`open_disk_tier`: the disk tier's start, one way for every integration that has one.

`KVStoreConnector`'s runtime and `LMDBTier` both start their disk tier here: open (or create)
the LMDB store, register the namespace (when the caller has its descriptor now), work out the
bytes this engine may use, delete the values it cannot serve, and rebuild its index from the
rest (`OpenedDisk.seed`: most recently used kept within the budget, the others deleted).

**Budget.** One store holds every namespace written to it, and its capacity bounds their sum:
this engine may use the capacity less what the store's other namespaces hold (a warning says
so). When that leaves less than one chunk, the start fails with a `ConfigError`.

**Damage.** A store file that cannot be read (`StoreDamagedError`: a record that cannot be
decoded; `StoreIOError`: LMDB cannot read the file) must not stop the engine: the tier runs
without its store (the connector with its CPU tier only; `LMDBTier` answering every lookup MISS
and failing every job, so vLLM keeps serving from its own CPU tier), with one loud error naming
the path and how to inspect it, `kvstore_io_errors_total{op="open"}` counted and
`kvstore_tier_up{tier="disk"}` at 0. The file is left as it was, for `kvstore verify`. A bad
path, an incompatible store format or namespace, or a capacity below one chunk is a
configuration error instead: `ConfigError` naming the option, and the engine does not start.

Runs once, on the thread that starts the integration, before any I/O thread exists.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvstore.errors import ConfigError
from kvstore.index.plans import SeedEntry
from kvstore.keys import BlockKey, Tier
from kvstore.metrics import IOOp, KVStoreMetrics
from tiers.errors import NamespaceError, StoreDamagedError, StoreIOError, TierConfigError
from tiers.lmdb import LMDBStore

__all__ = ["DiskTierRequest", "OpenedDisk", "open_disk_tier"]

logger = logging.getLogger(__name__)

_DAMAGE = (StoreDamagedError, StoreIOError)


@dataclass(frozen=True, slots=True)
class DiskTierRequest:
    """What to open. `path_label` and `capacity_label` are how errors name the two options
    (the connector's "disk_path", LMDBTier's "LMDBTier option 'path'"); `descriptor`, when
    given, is registered now (else the owner registers the namespace before its first write);
    `fallback` says what the integration does without its store (for the damage error)."""

    path: Path
    capacity_bytes: int
    namespace: str
    chunk_bytes: int
    path_label: str
    capacity_label: str
    descriptor: Mapping[str, Any] | None = None
    fallback: str = "running without the disk tier"


@dataclass(slots=True)
class OpenedDisk:
    """The opened tier: `store` is None when the file was damaged (run without it);
    `budget_bytes` is what this engine may use (0 without a store)."""

    store: LMDBStore | None
    budget_bytes: int
    namespace: str
    entries: list[SeedEntry] = field(default_factory=list)

    def seed(self, seed: Callable[[list[SeedEntry]], list[BlockKey]]) -> int:
        """Rebuild the owner's index with `seed` (`TierIndex.seed_disk`, `DiskIndex.seed`:
        returns what did not fit) and delete what did not fit; returns the chunks it serves."""
        entries, self.entries = self.entries, []
        if self.store is None or not entries:
            return 0
        unfit = seed(entries)
        if unfit:
            self.store.delete_many(self.namespace, unfit)
            logger.info("kvstore: deleted %d chunks beyond the disk tier's budget", len(unfit))
        return len(entries) - len(unfit)


def open_disk_tier(request: DiskTierRequest, metrics: KVStoreMetrics) -> OpenedDisk:
    """Open the disk tier (see the module docstring for the budget and damage policies)."""
    if request.capacity_bytes < request.chunk_bytes:
        raise ConfigError(
            f"{request.capacity_label}: {request.capacity_bytes} bytes is smaller than one "
            f"chunk ({request.chunk_bytes} bytes)"
        )
    try:
        store = LMDBStore.open(request.path, capacity_bytes=request.capacity_bytes)
    except _DAMAGE as exc:
        return _damaged(request, metrics, exc)
    except (TierConfigError, NamespaceError, OSError) as exc:
        raise ConfigError(
            f"{request.path_label}: cannot open an LMDB store at {request.path}: {exc}"
        ) from exc
    try:
        budget_bytes, entries = _scan(store, request)
    except _DAMAGE as exc:
        store.close()
        return _damaged(request, metrics, exc)
    except BaseException:
        store.close()
        raise
    return OpenedDisk(store, budget_bytes, request.namespace, entries)


def _scan(store: LMDBStore, request: DiskTierRequest) -> tuple[int, list[SeedEntry]]:
    """Register the namespace, take the budget, and list the servable values (deleting those
    that are not one chunk: this engine never wrote them)."""
    namespace = request.namespace
    if request.descriptor is not None and namespace not in store.namespaces():
        try:
            store.register_namespace(namespace, request.descriptor)
        except NamespaceError as exc:
            raise ConfigError(f"{request.path_label}: {exc}") from exc
    budget_bytes = _budget(store, request)
    if namespace not in store.namespaces():
        return budget_bytes, []
    entries: list[SeedEntry] = []
    wrong_size: list[BlockKey] = []
    for meta in store.iter_meta(namespace):
        key = BlockKey(meta.key)
        if meta.size_bytes == request.chunk_bytes:
            entries.append(SeedEntry(key, meta.size_bytes, meta.last_access_s))
        else:
            wrong_size.append(key)  # never serve a value of the wrong size
    if wrong_size:
        store.delete_many(namespace, wrong_size)
        logger.warning("kvstore: deleted %d chunks of the wrong size from disk", len(wrong_size))
    return budget_bytes, entries


def _budget(store: LMDBStore, request: DiskTierRequest) -> int:
    """The bytes this engine may use: the capacity less what other namespaces hold."""
    stats = store.stats()
    own = stats.namespaces.get(request.namespace)
    others = stats.used_bytes - (own.used_bytes if own is not None else 0)
    budget_bytes = request.capacity_bytes - others
    if budget_bytes < request.chunk_bytes:
        raise ConfigError(
            f"{request.capacity_label}: other namespaces of {request.path} use {others} of its "
            f"{request.capacity_bytes} bytes, leaving less than one chunk "
            f"({request.chunk_bytes} bytes); raise it, or remove them with "
            f"`kvstore rm --namespace`"
        )
    if others:
        logger.warning(
            "kvstore: other namespaces of %s use %d bytes; this engine may use %d of %d",
            request.path, others, budget_bytes, request.capacity_bytes,
        )  # fmt: skip
    return budget_bytes


def _damaged(request: DiskTierRequest, metrics: KVStoreMetrics, exc: Exception) -> OpenedDisk:
    logger.error(
        "kvstore: the disk store at %s cannot be read (%s); %s. Inspect it with "
        "`kvstore verify %s`, or move it aside to start afresh.",
        request.path, exc, request.fallback, request.path,
    )  # fmt: skip
    metrics.record_io_error(IOOp.OPEN)
    metrics.set_tier_up(Tier.DISK, False)
    return OpenedDisk(None, 0, request.namespace)
