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
