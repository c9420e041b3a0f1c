"""Writing chunks from CPU to disk, and the disk tier's own eviction and rebuild."""

from __future__ import annotations

from collections.abc import Iterable

from kvstore.index.core import IndexCore
from kvstore.index.errors import IndexStateError
from kvstore.index.plans import SeedEntry, WritePlan
from kvstore.index.table import READY, STORING, Entry
from kvstore.keys import BlockKey, Tier, short_hex

__all__ = ["WriteThroughOps"]


class WriteThroughOps(IndexCore):
    """The disk side of `TierIndex` (see there for the threading contract)."""

    def plan_write_through(self, keys: Iterable[BlockKey]) -> WritePlan:
        """Reserve disk space for chunks ready in CPU and not on disk, pinning their CPU rows.

        Evicts unpinned ready disk entries (by the disk policy, by bytes) to make room; they are
        reported removed and listed in `evicted` for the caller to delete. Keys not ready in CPU
        or already on disk are ignored; eligible keys that do not fit are `skipped`.
        """
        disk = self._disk
        if disk is None:
            return WritePlan()
        cpu = self._cpu
        size_bytes = self._config.chunk_bytes
        eligible: list[Entry] = []
        for key in dict.fromkeys(keys):
            entry = cpu.entries.get(key)
            if entry is not None and entry.state is READY and key not in disk.entries:
                eligible.append(entry)
        # Make room for the whole batch in one eviction; key by key only when that cannot.
        evicted = self._evict_disk(len(eligible) * size_bytes - disk.free_bytes)
        planned: list[BlockKey] = []
        rows: list[int] = []
        skipped: list[BlockKey] = []
        for entry in eligible:
            if disk.free_bytes < size_bytes and not skipped:
                evicted += self._evict_disk(size_bytes - disk.free_bytes)
            if disk.free_bytes < size_bytes:
                skipped.append(entry.key)
                entry.token_ids = None
                continue
            cpu.pin(entry)
            disk.add(entry.key, size_bytes, entry.parent_key, entry.token_ids)
            entry.token_ids = None
            planned.append(entry.key)
            rows.append(entry.row)
        self._emit_removed(Tier.DISK, evicted, "evicted")
        return WritePlan(
            keys=tuple(planned), rows=tuple(rows), evicted=tuple(evicted), skipped=tuple(skipped)
        )

    def complete_write_through(self, keys: Iterable[BlockKey], success: bool) -> None:
        """End a `plan_write_through`: disk entries become ready (or are dropped); rows unpinned."""
        disk = self._disk
        pairs = [self._writing(key) for key in keys]
        if disk is None:
            return
        if success:
            for disk_entry, _ in pairs:
                disk.set_ready(disk_entry)
            self._emit_stored(Tier.DISK, [disk_entry for disk_entry, _ in pairs])
            for disk_entry, _ in pairs:
                disk_entry.token_ids = None
        else:
            for disk_entry, _ in pairs:
                disk.drop(disk_entry)
        for _, cpu_entry in pairs:
            self._cpu.unpin(cpu_entry)

    def evict_disk_to(self, max_bytes: int, reason: str = "evicted") -> list[BlockKey]:
        """Evict unpinned ready disk entries until at most `max_bytes` are used (as far as it can).

        Returns the evicted keys, for the caller to delete from the store.
        """
        if max_bytes < 0:
            raise ValueError(f"max_bytes must be >= 0, got {max_bytes}")
        disk = self._disk
        if disk is None or disk.used_bytes <= max_bytes:
            return []
        num_victims = disk.victims_for(disk.used_bytes - max_bytes)
        if num_victims < 0:
            num_victims = disk.num_evictable
        victims = disk.evict(num_victims, frozenset()) or []
        keys = [entry.key for entry in victims]
        self._emit_removed(Tier.DISK, keys, reason)
        return keys

    def seed_disk(self, entries: Iterable[SeedEntry]) -> list[BlockKey]:
        """Rebuild the disk tier from what the store already holds, most recently used kept.

        The policy is ordered by `last_access_s`; each chunk is reported stored (no parent or
        tokens known). Keys already indexed are ignored. Returns the chunks that did not fit,
        for the caller to delete from the store.
        """
        disk = self._disk
        if disk is None:
            raise IndexStateError("seed_disk: the index has no disk tier (disk_capacity_bytes=0)")
        newest_first = sorted(entries, key=lambda seed: seed.last_access_s, reverse=True)
        kept: list[SeedEntry] = []
        seen: set[BlockKey] = set()
        dropped: list[BlockKey] = []
        free_bytes = disk.free_bytes
        for seed in newest_first:
            if seed.size_bytes <= 0:
                raise ValueError(
                    f"seed_disk: chunk {short_hex(seed.key)} has size_bytes {seed.size_bytes}; "
                    f"a stored chunk must be at least 1 byte"
                )
            if seed.key in seen or seed.key in disk.entries:
                continue
            seen.add(seed.key)
            if seed.size_bytes > free_bytes:
                dropped.append(seed.key)
                continue
            free_bytes -= seed.size_bytes
            kept.append(seed)
        added: list[Entry] = []
        for seed in reversed(kept):
            entry = disk.add(seed.key, seed.size_bytes)
            disk.set_ready(entry)
            added.append(entry)
        for entry in added:
            self._emit_stored(Tier.DISK, [entry])
        return dropped

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
