"""Promotion: reading disk-only chunks back into CPU rows so they can be loaded."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from kvstore.index.core import IndexCore
from kvstore.index.errors import IndexStateError
from kvstore.index.plans import PromotionPlan
from kvstore.index.table import Entry
from kvstore.keys import BlockKey, Tier, short_hex

__all__ = ["PromotionOps"]


class PromotionOps(IndexCore):
    """The disk→CPU side of `TierIndex` (see there for the threading contract)."""

    def plan_promotion(self, keys: Sequence[BlockKey]) -> PromotionPlan:
        """Hold a request's servable prefix in CPU, reserving rows for its disk-only chunks.

        `keys` are in prefix order (a `lookup` result's keys). Chunks already ready in CPU are
        held; each disk-only chunk gets a CPU row (free, or by evicting an unpinned chunk outside
        this prefix), a `storing` CPU entry that is held, and a pin on its disk entry while it is
        read. Never over-commits: the plan stops where room runs out. Every hold lasts until
        `release` (or a failed `complete_promotion`).
        """
        if len(set(keys)) != len(keys):
            raise ValueError("plan_promotion: keys must be distinct")
        tiers, _ = self._servable_prefix(keys)
        prefix = keys[: len(tiers)]
        num_new = tiers.count(Tier.DISK)
        num_free = len(self._cpu.free_rows)
        evicted: list[BlockKey] = []
        if num_new > num_free:
            evicted = self._evict_cpu(num_new - num_free, frozenset(prefix))
        promoted: list[BlockKey] = []
        rows: list[int] = []
        held: list[BlockKey] = []
        for i, (key, tier) in enumerate(zip(prefix, tiers, strict=True)):
            if tier is Tier.CPU:
                entry = self._cpu.entries[key]
                held.append(key)
            else:
                entry = self._start_promotion(key, keys[i - 1] if i > 0 else None)
                promoted.append(key)
                rows.append(entry.row)
            self._cpu.pin(entry)
            self._holds[key] = self._holds.get(key, 0) + 1
        return PromotionPlan(
            keys=tuple(promoted),
            rows=tuple(rows),
            held=tuple(held),
            evicted=tuple(evicted),
            num_skipped=len(keys) - len(prefix),
        )

    def complete_promotion(self, keys: Iterable[BlockKey], success: bool) -> None:
        """End a promotion read: CPU entries become ready (still held) or are freed on failure.

        The disk entries are unpinned either way, and touched on success.
        """
        pairs = [self._promotion(key) for key in keys]
        cpu = self._cpu
        for cpu_entry, disk_entry in pairs:
            self._promoting.discard(cpu_entry.key)
            if self._disk is not None:  # always, for a promotion in flight
                if success:
                    self._disk.policy.touch(disk_entry.key)
                self._disk.unpin(disk_entry)
            if success:
                cpu.set_ready(cpu_entry)
            else:
                self._drop_hold(cpu_entry.key)
                cpu.drop(cpu_entry)
        if success:
            self._emit_stored(Tier.CPU, [cpu_entry for cpu_entry, _ in pairs])

    def hold(self, keys: Iterable[BlockKey]) -> list[BlockKey]:
        """Hold chunks ready in CPU (pinned) for a requester that will load them, as
        `plan_promotion` does; returns the keys held. End each hold with `release`."""
        held: list[BlockKey] = []
        for key in keys:
            entry = self._cpu.ready(key)
            if entry is None:
                continue
            self._cpu.pin(entry)
            self._holds[key] = self._holds.get(key, 0) + 1
            held.append(key)
        return held

    def release(self, keys: Iterable[BlockKey]) -> int:
        """Drop one hold per key taken by `plan_promotion`; keys without a hold are ignored.

        Call it once the request has prepared its load (which pins on its own) or is abandoned.
        Returns the number of holds released.
        """
        num_released = 0
        for key in keys:
            if self._drop_hold(key):
                self._cpu.unpin(self._cpu.entries[key])
                num_released += 1
        return num_released

    def _start_promotion(self, key: BlockKey, parent_key: BlockKey | None) -> Entry:
        assert self._disk is not None
        self._disk.pin(self._disk.entries[key])
        self._promoting.add(key)
        return self._cpu.add(key, parent_key)

    def _drop_hold(self, key: BlockKey) -> bool:
        num_holds = self._holds.get(key, 0)
        if num_holds == 0:
            return False
        if num_holds == 1:
            del self._holds[key]
        else:
            self._holds[key] = num_holds - 1
        return True

    def _promotion(self, key: BlockKey) -> tuple[Entry, Entry]:
        """The CPU entry being filled and the pinned disk entry it is read from."""
        cpu_entry = self._cpu.entries.get(key)
        disk_entry = self._disk.entries.get(key) if self._disk is not None else None
        if key not in self._promoting or cpu_entry is None or disk_entry is None:
            raise IndexStateError(
                f"complete_promotion: chunk {short_hex(key)} has no promotion in flight"
            )
        return cpu_entry, disk_entry
