"""One tier's entries: states, pins, size accounting and its eviction policy.

An entry is `storing` (space reserved, bytes in flight), `ready` (servable; reported stored) or
`removing` (dropped from service while pinned; freed at the last unpin). Dropped entries are gone.
A ready entry with no pins is evictable; the table keeps that count so callers can tell how much
room eviction could make without scanning.
"""

from __future__ import annotations

from collections.abc import Container, Iterable, Set
from dataclasses import dataclass
from enum import StrEnum
from typing import cast

from kvstore.index.errors import IndexStateError
from kvstore.keys import BlockKey, Tier, short_hex
from kvstore.policies import EvictionPolicy

__all__ = ["CPUTable", "DiskTable", "Entry", "EntryState", "TierTable"]


class EntryState(StrEnum):
    STORING = "storing"
    READY = "ready"
    REMOVING = "removing"


STORING, READY, REMOVING = EntryState.STORING, EntryState.READY, EntryState.REMOVING


@dataclass(slots=True)
class Entry:
    """A chunk in one tier (mutable state, owned by its table).

    `parent_key` and `token_ids` are kept only until the chunk's stored event is emitted in every
    tier it is headed for.
    """

    key: BlockKey
    state: EntryState
    size_bytes: int
    row: int = -1
    num_pins: int = 0
    parent_key: BlockKey | None = None
    token_ids: tuple[int, ...] | None = None


class _Unevictable:
    """`key in protected` for a policy walk: pinned, not ready, absent, or in `extra`."""

    __slots__ = ("_entries", "_extra")

    def __init__(self, entries: dict[BlockKey, Entry], extra: Set[BlockKey]) -> None:
        self._entries = entries
        self._extra = extra

    def __contains__(self, key: object) -> bool:
        entry = self._entries.get(cast(BlockKey, key))
        return entry is None or entry.num_pins > 0 or entry.state is not READY or key in self._extra


class TierTable:
    """Entries of one tier with their accounting. Not thread-safe (see `TierIndex`)."""

    def __init__(self, tier: Tier, policy: EvictionPolicy, capacity_bytes: int) -> None:
        self.tier = tier
        self.policy = policy
        self.capacity_bytes = capacity_bytes
        self.used_bytes = 0
        self.entries: dict[BlockKey, Entry] = {}
        self.num_pinned = 0
        self.num_storing = 0
        self.num_removing = 0
        self.num_evictable = 0

    @property
    def free_bytes(self) -> int:
        return self.capacity_bytes - self.used_bytes

    def ready(self, key: BlockKey) -> Entry | None:
        entry = self.entries.get(key)
        return entry if entry is not None and entry.state is READY else None

    def protected(self, extra: Set[BlockKey] = frozenset()) -> Container[BlockKey]:
        """What a policy walk must skip: entries not evictable, plus `extra`."""
        return _Unevictable(self.entries, extra)

    def _add(self, entry: Entry) -> Entry:
        self.entries[entry.key] = entry
        self.used_bytes += entry.size_bytes
        self.num_storing += 1
        self.policy.insert(entry.key)
        return entry

    def set_ready(self, entry: Entry) -> None:
        self._expect(entry, STORING, "become ready")
        entry.state = READY
        self.num_storing -= 1
        if entry.num_pins == 0:
            self.num_evictable += 1

    def pin(self, entry: Entry) -> None:
        if entry.num_pins == 0:
            self.num_pinned += 1
            if entry.state is READY:
                self.num_evictable -= 1
        entry.num_pins += 1

    def unpin(self, entry: Entry) -> bool:
        """Release one pin; a `removing` entry is dropped at its last. Returns whether dropped."""
        if entry.num_pins == 0:
            raise IndexStateError(
                f"chunk {short_hex(entry.key)} in {self.tier} is not pinned; unpin needs a pin"
            )
        entry.num_pins -= 1
        if entry.num_pins:
            return False
        self.num_pinned -= 1
        if entry.state is READY:
            self.num_evictable += 1
        elif entry.state is REMOVING:
            self.drop(entry)
            return True
        return False

    def mark_removing(self, entry: Entry) -> None:
        """Take a pinned ready entry out of service; it is freed at its last unpin."""
        self._expect(entry, READY, "be marked removing")
        if entry.num_pins == 0:
            raise IndexStateError(f"chunk {short_hex(entry.key)} is unpinned: drop it instead")
        entry.state = REMOVING
        self.num_removing += 1
        self.policy.remove(entry.key)

    def take_out_of_service(self, keys: Iterable[BlockKey]) -> list[BlockKey]:
        """Ready entries stop being served: an unpinned one is freed now, a pinned one at its
        last unpin. Other states are left to their `complete_*`. Returns the keys taken out."""
        gone: list[BlockKey] = []
        for key in keys:
            entry = self.entries.get(key)
            if entry is None or entry.state is not READY:
                continue
            if entry.num_pins:
                self.mark_removing(entry)
            else:
                self.drop(entry)
            gone.append(key)
        return gone

    def drop(self, entry: Entry) -> None:
        """Forget an entry in any state and free its space (no event: the caller emits)."""
        if entry.state is REMOVING:
            self.num_removing -= 1
        else:
            self.policy.remove(entry.key)
            if entry.state is STORING:
                self.num_storing -= 1
            elif entry.num_pins == 0:
                self.num_evictable -= 1
        if entry.num_pins:
            self.num_pinned -= 1
            entry.num_pins = 0
        self._forget(entry)

    def evict(self, n: int, extra_protected: Set[BlockKey] = frozenset()) -> list[Entry] | None:
        """Evict exactly `n` evictable entries not in `extra_protected`; None changes nothing."""
        keys = self.policy.evict(n, _Unevictable(self.entries, extra_protected))
        if keys is None:
            return None
        victims = [self.entries[key] for key in keys]
        self.num_evictable -= len(victims)
        for entry in victims:
            self._forget(entry)
        return victims

    def _forget(self, entry: Entry) -> None:
        del self.entries[entry.key]
        self.used_bytes -= entry.size_bytes

    def _expect(self, entry: Entry, state: EntryState, action: str) -> None:
        if entry.state is not state:
            raise IndexStateError(
                f"chunk {short_hex(entry.key)} in {self.tier} is {entry.state}; "
                f"only a {state} chunk can {action}"
            )


class CPUTable(TierTable):
    """The CPU tier: each entry owns one row in `range(num_rows)`, handed out from a free list."""

    def __init__(self, policy: EvictionPolicy, num_rows: int, row_bytes: int) -> None:
        super().__init__(Tier.CPU, policy, num_rows * row_bytes)
        self.num_rows = num_rows
        self.row_bytes = row_bytes
        # A stack: row 0 is handed out first.
        self.free_rows: list[int] = list(range(num_rows - 1, -1, -1))

    def add(
        self,
        key: BlockKey,
        parent_key: BlockKey | None = None,
        token_ids: tuple[int, ...] | None = None,
    ) -> Entry:
        """A new `storing` entry in a free row (the caller made room)."""
        row = self.free_rows.pop()
        return self._add(Entry(key, STORING, self.row_bytes, row, 0, parent_key, token_ids))

    def _forget(self, entry: Entry) -> None:
        super()._forget(entry)
        self.free_rows.append(entry.row)


class DiskTable(TierTable):
    """The disk tier: entries sized in bytes against a byte budget."""

    def __init__(self, policy: EvictionPolicy, capacity_bytes: int) -> None:
        super().__init__(Tier.DISK, policy, capacity_bytes)

    def add(
        self,
        key: BlockKey,
        size_bytes: int,
        parent_key: BlockKey | None = None,
        token_ids: tuple[int, ...] | None = None,
    ) -> Entry:
        """A new `storing` entry of `size_bytes` (the caller made room)."""
        return self._add(Entry(key, STORING, size_bytes, -1, 0, parent_key, token_ids))

    def victims_for(self, num_bytes: int, extra_protected: Set[BlockKey] = frozenset()) -> int:
        """How many of the policy's next victims free at least `num_bytes`; -1 if none can."""
        if num_bytes <= 0:
            return 0
        freed_bytes = 0
        victims = self.policy.victims(_Unevictable(self.entries, extra_protected))
        for num_victims, key in enumerate(victims, start=1):
            freed_bytes += self.entries[key].size_bytes
            if freed_bytes >= num_bytes:
                return num_victims
        return -1
