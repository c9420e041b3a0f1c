"""What the index's operations return: small frozen values.

Keys and CPU rows travel as parallel tuples (`keys[i]` lives in `rows[i]`), the shape the transfer
jobs want, without one object per chunk.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from kvstore.keys import BlockKey, Tier

__all__ = [
    "IndexStats",
    "LoadPlan",
    "LookupResult",
    "PromotionPlan",
    "SeedEntry",
    "StorePlan",
    "TierStats",
    "WritePlan",
]


@dataclass(frozen=True, slots=True)
class LookupResult:
    """The longest contiguous prefix of the looked-up keys available in CPU or disk.

    `tiers[i]` is where `keys[i]` will be served from (CPU when it is in both). Disk hits count only
    as far as the CPU tier can make room to promote them; `is_promotion_limited` says the prefix
    stopped there (the next key was on disk but every CPU row is pinned).
    """

    keys: tuple[BlockKey, ...]
    tiers: tuple[Tier, ...]
    num_cpu_hits: int
    num_disk_hits: int
    is_promotion_limited: bool = False

    @property
    def num_hits(self) -> int:
        return len(self.keys)

    @property
    def disk_keys(self) -> tuple[BlockKey, ...]:
        """The hits that must be promoted to CPU before they can be loaded."""
        return tuple(
            key for key, tier in zip(self.keys, self.tiers, strict=True) if tier is Tier.DISK
        )


@dataclass(frozen=True, slots=True)
class StorePlan:
    """Chunks to copy into the CPU region: `keys[i]` goes to row `rows[i]` (entries `storing`).

    `evicted` left the CPU tier to make room. `num_skipped` keys needed storing but did not fit.
    """

    keys: tuple[BlockKey, ...]
    rows: tuple[int, ...]
    evicted: tuple[BlockKey, ...] = ()
    num_skipped: int = 0

    def items(self) -> Iterator[tuple[BlockKey, int]]:
        return zip(self.keys, self.rows, strict=True)


@dataclass(frozen=True, slots=True)
class WritePlan:
    """Chunks to write from CPU rows to disk: `keys[i]` is read from row `rows[i]` (row pinned).

    `evicted` left the disk tier to make room: delete them from the store. `skipped` were eligible
    but did not fit (every disk entry pinned or in flight).
    """

    keys: tuple[BlockKey, ...] = ()
    rows: tuple[int, ...] = ()
    evicted: tuple[BlockKey, ...] = ()
    skipped: tuple[BlockKey, ...] = ()

    def items(self) -> Iterator[tuple[BlockKey, int]]:
        return zip(self.keys, self.rows, strict=True)


@dataclass(frozen=True, slots=True)
class LoadPlan:
    """Chunks ready in CPU, pinned until `complete_load`: `keys[i]` is read from row `rows[i]`.

    `missing` are not ready in CPU (promote them first, or recompute).
    """

    keys: tuple[BlockKey, ...]
    rows: tuple[int, ...]
    missing: tuple[BlockKey, ...] = ()

    def items(self) -> Iterator[tuple[BlockKey, int]]:
        return zip(self.keys, self.rows, strict=True)


@dataclass(frozen=True, slots=True)
class PromotionPlan:
    """Disk chunks to read into CPU rows: `keys[i]` goes to row `rows[i]`.

    `held` were already in CPU and are now held (pinned) with the promoted ones until `release`.
    `evicted` left the CPU tier to make room. The plan covers a prefix of the requested keys;
    `num_skipped` is how many keys after it were not available or did not fit.
    """

    keys: tuple[BlockKey, ...]
    rows: tuple[int, ...]
    held: tuple[BlockKey, ...] = ()
    evicted: tuple[BlockKey, ...] = ()
    num_skipped: int = 0

    def items(self) -> Iterator[tuple[BlockKey, int]]:
        return zip(self.keys, self.rows, strict=True)


@dataclass(frozen=True, slots=True)
class SeedEntry:
    """A chunk the disk store already holds, as reported when the index is rebuilt."""

    key: BlockKey
    size_bytes: int
    last_access_s: float


@dataclass(frozen=True, slots=True)
class TierStats:
    """One tier's occupancy. CPU bytes are rows times `chunk_bytes`."""

    tier: Tier
    num_entries: int
    num_ready: int
    num_storing: int
    num_removing: int
    num_pinned: int
    num_evictable: int
    used_bytes: int
    free_bytes: int
    capacity_bytes: int


@dataclass(frozen=True, slots=True)
class IndexStats:
    """Per-tier occupancy plus in-flight work. `disk` is None without a disk tier."""

    cpu: TierStats
    disk: TierStats | None
    num_holds: int
    num_promoting: int
    num_write_through_candidates: int
