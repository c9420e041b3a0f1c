"""State shared by the index's operations, and the helpers they have in common."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence, Set

from kvstore.index.admission import SightingCounter
from kvstore.index.config import IndexConfig
from kvstore.index.disk import DiskIndex
from kvstore.index.event_log import EventLog
from kvstore.index.table import READY, CPUTable, DiskTable, Entry
from kvstore.keys import BlockKey, Tier
from kvstore.policies import make_policy

__all__ = ["IndexCore"]

# Sightings remembered per chunk the tiers can hold: enough to see a key come back after it left.
_SIGHTINGS_PER_CHUNK = 2


class IndexCore:
    """The tiers, pending events and in-flight bookkeeping; operations live in subclasses."""

    def __init__(self, config: IndexConfig, clock: Callable[[], float] = time.time) -> None:
        self._config = config
        self._clock = clock
        self._cpu = CPUTable(
            make_policy(config.cpu_policy, config.num_cpu_rows),
            config.num_cpu_rows,
            config.chunk_bytes,
        )
        self._log = EventLog(config.num_tokens_per_chunk, clock)
        self._disk_index: DiskIndex | None = None
        self._disk: DiskTable | None = None  # the disk index's table
        if config.has_disk:
            self._disk_index = DiskIndex(
                config.disk_policy, config.disk_capacity_bytes, config.chunk_bytes, self._log
            )
            self._disk = self._disk_index.table
        self._sightings: SightingCounter | None = None
        if config.admission_min_sightings > 1:
            max_keys = _SIGHTINGS_PER_CHUNK * (config.num_cpu_rows + config.num_disk_chunks)
            self._sightings = SightingCounter(config.admission_min_sightings, max_keys)
        # Chunks ready in CPU that should be written to disk (an ordered set).
        self._candidates: dict[BlockKey, None] = {}
        # Holds taken by plan_promotion, per key, until release.
        self._holds: dict[BlockKey, int] = {}
        # Keys whose CPU entry is being filled from disk.
        self._promoting: set[BlockKey] = set()

    @property
    def config(self) -> IndexConfig:
        return self._config

    def _emit_stored(self, tier: Tier, entries: Sequence[Entry]) -> None:
        self._log.stored(tier, entries)

    def _emit_removed(self, tier: Tier, keys: Sequence[BlockKey], reason: str) -> None:
        self._log.removed(tier, keys, reason)

    def _evict_cpu(self, num_rows: int, protected: Set[BlockKey]) -> list[BlockKey]:
        """Evict exactly `num_rows` CPU entries the caller has counted as evictable."""
        victims = self._cpu.evict(num_rows, protected)
        if victims is None:
            raise AssertionError(f"CPU tier could not evict the {num_rows} rows it counted")
        keys = [entry.key for entry in victims]
        candidates = self._candidates
        for key in keys:
            candidates.pop(key, None)
        self._emit_removed(Tier.CPU, keys, "evicted")
        return keys

    def _servable_prefix(self, keys: Sequence[BlockKey]) -> tuple[list[Tier], bool]:
        """Where each key of the longest servable prefix lives, and whether CPU room cut it short.

        A disk-only key needs a CPU row to be promoted into: a free row, or an evictable entry
        that is not itself part of this prefix (those are held while the promotion runs).
        """
        cpu_entries = self._cpu.entries
        disk_entries = self._disk.entries if self._disk is not None else {}
        room = len(self._cpu.free_rows) + self._cpu.num_evictable
        tiers: list[Tier] = []
        has_disk_hit = False
        for key in keys:
            entry = cpu_entries.get(key)
            if entry is not None:
                if entry.state is not READY:
                    break
                if entry.num_pins == 0:
                    room -= 1
                    if room < 0 and has_disk_hit:
                        return tiers, True
                tiers.append(Tier.CPU)
                continue
            entry = disk_entries.get(key)
            if entry is None or entry.state is not READY:
                break
            if room <= 0:
                return tiers, True
            room -= 1
            has_disk_hit = True
            tiers.append(Tier.DISK)
        return tiers, False

    def _is_write_candidate(self, key: BlockKey) -> bool:
        """Should a chunk ready in CPU be written through to disk now?"""
        if self._disk is None or key in self._disk.entries:
            return False
        return self._sightings is None or self._sightings.is_admitted(key)
