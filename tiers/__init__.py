"""Storage media for kvstore: the engine's paged KV view, the shared CPU region, LMDB on disk.

Synchronous code only; this package imports neither `kvstore`, `asyncio` nor `vllm`.

    PagedKVView   gathers/scatters whole engine blocks into/out of a flat chunk buffer
    ChunkCopy     one chunk buffer of a batched gather_many / scatter_many
    ChunkLayout   describes that buffer (per-layer dtype, shape, offset); decodes it
    CPURegion     the shared-memory file of chunk rows (scheduler creates, workers attach)
    LMDBStore     the persistent, checksummed disk tier
    MemoryStore   an in-memory store with the same contract, for tests
"""

from __future__ import annotations

import importlib as _importlib
import typing as _typing

if _typing.TYPE_CHECKING:
    from tiers._lmdb_env import LMDBOptions
    from tiers.cpu import DEFAULT_REGION_DIRECTORY, CPURegion, RegionHeader, reclaim_stale_regions
    from tiers.errors import (
        CorruptionError,
        NamespaceError,
        RegionError,
        StoreDamagedError,
        StoreFullError,
        StoreIOError,
        TierConfigError,
        TierError,
    )
    from tiers.layout import ChunkLayout, LayerLayout
    from tiers.lmdb import FORMAT_VERSION, LMDBStore
    from tiers.memory import MemoryStore
    from tiers.paged import ChunkCopy, PagedKVView, find_block_dim
    from tiers.store import BlockStore, EntryMeta, NamespaceStats, StoreStats, checksum

# Names resolve on first use (PEP 562): `import tiers.errors` (the CLI's light commands) must not
# import torch through tiers.cpu; `from tiers import CPURegion` works as before.
_SOURCES = {
    "LMDBOptions": "tiers._lmdb_env",
    "DEFAULT_REGION_DIRECTORY": "tiers.cpu",
    "CPURegion": "tiers.cpu",
    "RegionHeader": "tiers.cpu",
    "reclaim_stale_regions": "tiers.cpu",
    "CorruptionError": "tiers.errors",
    "NamespaceError": "tiers.errors",
    "RegionError": "tiers.errors",
    "StoreDamagedError": "tiers.errors",
    "StoreFullError": "tiers.errors",
    "StoreIOError": "tiers.errors",
    "TierConfigError": "tiers.errors",
    "TierError": "tiers.errors",
    "ChunkLayout": "tiers.layout",
    "LayerLayout": "tiers.layout",
    "FORMAT_VERSION": "tiers.lmdb",
    "LMDBStore": "tiers.lmdb",
    "MemoryStore": "tiers.memory",
    "ChunkCopy": "tiers.paged",
    "PagedKVView": "tiers.paged",
    "find_block_dim": "tiers.paged",
    "BlockStore": "tiers.store",
    "EntryMeta": "tiers.store",
    "NamespaceStats": "tiers.store",
    "StoreStats": "tiers.store",
    "checksum": "tiers.store",
}


def __getattr__(name: str) -> _typing.Any:
    module = _SOURCES.get(name)
    if module is None:
        raise AttributeError(f"module 'tiers' has no attribute {name!r}")
    return getattr(_importlib.import_module(module), name)


__all__ = [
    "DEFAULT_REGION_DIRECTORY",
    "FORMAT_VERSION",
    "BlockStore",
    "CPURegion",
    "ChunkLayout",
    "CorruptionError",
    "EntryMeta",
    "LMDBOptions",
    "LMDBStore",
    "LayerLayout",
    "MemoryStore",
    "NamespaceError",
    "NamespaceStats",
    "ChunkCopy",
    "PagedKVView",
    "RegionError",
    "RegionHeader",
    "StoreDamagedError",
    "StoreFullError",
    "StoreIOError",
    "StoreStats",
    "TierConfigError",
    "TierError",
    "checksum",
    "find_block_dim",
    "reclaim_stale_regions",
]
