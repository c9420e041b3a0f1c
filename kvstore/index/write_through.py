"""Writing chunks from CPU to disk, and the disk tier's own eviction and rebuild."""

from __future__ import annotations

from collections.abc import Iterable

from kvstore.index.core import IndexCore
from kvstore.index.disk import DiskCandidate
from kvstore.index.errors import IndexStateError
from kvstore.index.plans import SeedEntry, WritePlan
from kvstore.index.table import READY, STORING, Entry
from kvstore.keys import BlockKey, short_hex

__all__ = ["WriteThroughOps"]


class WriteThroughOps(IndexCore):
    """The disk side of `TierIndex` (see there for the threading contract)."""

    def plan_write_through(self, keys: Iterable[BlockKey] | None = None) -> WritePlan:
        """Reserve disk space for chunks ready in CPU and not on disk, pinning their CPU rows:
        `keys`, or (by default) the chunks that became ready in CPU since the last call.

        Evicts unpinned ready disk entries (by the disk policy, by bytes) to make room; they are
        reported removed and listed in `evicted` for the caller to delete. Keys not ready in CPU
        or already on disk are ignored; eligible keys that do not fit are `skipped`.
        """
        disk = self._disk_index
        if keys is None:
            keys = list(self._candidates)
            self._candidates.clear()
        if disk is None:
            return WritePlan()
        cpu = self._cpu
        eligible: dict[BlockKey, Entry] = {}
        for key in dict.fromkeys(keys):
            entry = cpu.entries.get(key)
            if entry is not None and entry.state is READY and key not in disk.table.entries:
                eligible[key] = entry
        reservation = disk.reserve(
            DiskCandidate(e.key, e.parent_key, e.token_ids) for e in eligible.values()
        )
        rows: list[int] = []
        for key in reservation.keys:
            cpu.pin(eligible[key])
            rows.append(eligible[key].row)
        for entry in eligible.values():
            entry.token_ids = None  # the disk entry carries them until its event
        return WritePlan(
            keys=reservation.keys,
            rows=tuple(rows),
            evicted=reservation.evicted,
            skipped=reservation.skipped,
        )

    def complete_write_through(self, keys: Iterable[BlockKey], success: bool) -> None:
        """End a `plan_write_through`: disk entries become ready (or are dropped); rows unpinned."""
        disk = self._disk_index
        pairs = [self._writing(key) for key in keys]
        if disk is None:
            return
        disk.complete([disk_entry.key for disk_entry, _ in pairs], success)
        for _, cpu_entry in pairs:
            self._cpu.unpin(cpu_entry)

    def evict_disk_to(self, max_bytes: int, reason: str = "evicted") -> list[BlockKey]:
        """Evict unpinned ready disk entries until at most `max_bytes` are used (as far as it can).

        Returns the evicted keys, for the caller to delete from the store.
        """
        if max_bytes < 0:
            raise ValueError(f"max_bytes must be >= 0, got {max_bytes}")
        disk = self._disk_index
        return [] if disk is None else disk.evict_to(max_bytes, reason)

    def seed_disk(self, entries: Iterable[SeedEntry]) -> list[BlockKey]:
        """Rebuild the disk tier from what the store already holds, most recently used kept.

        The policy is ordered by `last_access_s`; each chunk is reported stored (no parent or
        tokens known). Keys already indexed are ignored. Returns the chunks that did not fit,
        for the caller to delete from the store.
        """
        disk = self._disk_index
        if disk is None:
            raise IndexStateError("seed_disk: the index has no disk tier (disk_capacity_bytes=0)")
        return disk.seed(entries)

    def _writing(self, key: BlockKey) -> tuple[Entry, Entry]:
        """The disk entry being written and the pinned CPU entry it is read from."""
        disk_entry = self._disk.entries.get(key) if self._disk is not None else None
        cpu_entry = self._cpu.entries.get(key)
        if (
            disk_entry is None
            or disk_entry.state is not STORING
            or cpu_entry is None
            or cpu_entry.num_pins == 0
        ):
            raise IndexStateError(
                f"complete_write_through: chunk {short_hex(key)} has no write-through in flight"
            )
        return disk_entry, cpu_entry
