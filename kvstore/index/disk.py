"""`DiskIndex`: the disk tier's placement, shared by every integration that has one.

Entries sized in bytes against a byte budget under an eviction policy, each `storing` ->
`ready` -> (`removing` ->) dropped, with pins; rebuilt from the store at start (`seed`). Used
by `TierIndex` (KVStoreConnector's write-through from CPU rows, promotion back into them) and
by `DiskPipeline` (LMDBTier: vLLM's own CPU tier cascading into kvstore's disk), so the two
cannot drift.

Events go to an `EventLog` the owner shares: a chunk is reported stored when it becomes ready
(or is found on disk at start) and removed when it stops being served, at most once per store.
Threading: NOT thread-safe and does no I/O; one owner thread calls everything.
"""

from __future__ import annotations

from collections.abc import Iterable, Set
from dataclasses import dataclass

from kvstore.index.event_log import EventLog
from kvstore.index.plans import SeedEntry
from kvstore.index.table import REMOVING, STORING, DiskTable, Entry
from kvstore.keys import BlockKey, Tier, short_hex
from kvstore.occupancy import Occupancy
from kvstore.policies import make_policy

__all__ = ["DiskCandidate", "DiskIndex", "DiskReservation"]


@dataclass(frozen=True, slots=True)
class DiskCandidate:
    """A chunk to write: its key, and the lineage events carry (when known)."""

    key: BlockKey
    parent_key: BlockKey | None = None
    token_ids: tuple[int, ...] | None = None


@dataclass(frozen=True, slots=True)
class DiskReservation:
    """`keys` are now `storing` (write them); `evicted` were removed to make room (delete them
    first); `skipped` could not be stored now (no room, or still leaving the tier)."""

    keys: tuple[BlockKey, ...] = ()
    evicted: tuple[BlockKey, ...] = ()
    skipped: tuple[BlockKey, ...] = ()


class DiskIndex:
    """The disk tier's index (see the module docstring)."""

    def __init__(self, policy: str, capacity_bytes: int, chunk_bytes: int, log: EventLog) -> None:
        num_chunks = max(1, capacity_bytes // max(1, chunk_bytes))
        self.table = DiskTable(make_policy(policy, num_chunks), capacity_bytes)
        self._chunk_bytes = chunk_bytes
        self._log = log

    # -- queries ----------------------------------------------------------------------------

    def is_ready(self, key: BlockKey) -> bool:
        return self.table.ready(key) is not None

    def occupancy(self) -> Occupancy:
        """How full the tier is (plain ints: safe to read from the metrics thread)."""
        table = self.table
        return Occupancy(table.used_bytes, table.capacity_bytes, len(table.entries))

    # -- writes -----------------------------------------------------------------------------

    def reserve(
        self, candidates: Iterable[DiskCandidate], protected: Set[BlockKey] = frozenset()
    ) -> DiskReservation:
        """Reserve a chunk's bytes for each candidate not on disk yet, evicting unpinned ready
        chunks outside `protected` by the policy: what the whole batch needs at once, key by
        key only when that cannot be done. Chunks already on disk are left alone."""
        table, size = self.table, self._chunk_bytes
        new: list[DiskCandidate] = []
        leaving: list[BlockKey] = []
        seen: set[BlockKey] = set()
        for candidate in candidates:
            if candidate.key in seen:
                continue
            seen.add(candidate.key)
            entry = table.entries.get(candidate.key)
            if entry is None:
                new.append(candidate)
            elif entry.state is REMOVING:
                leaving.append(candidate.key)  # still pinned by a read: cannot be stored again
        protected = protected | seen
        evicted = self._evict(len(new) * size - table.free_bytes, protected)
        stored: list[BlockKey] = []
        skipped: list[BlockKey] = []
        for candidate in new:
            if table.free_bytes < size and not skipped:
                evicted += self._evict(size - table.free_bytes, protected)
            if table.free_bytes < size:
                skipped.append(candidate.key)
                continue
            table.add(candidate.key, size, candidate.parent_key, candidate.token_ids)
            stored.append(candidate.key)
        self._log.removed(Tier.DISK, evicted, "evicted")
        return DiskReservation(tuple(stored), tuple(evicted), tuple(skipped + leaving))

    def complete(self, keys: Iterable[BlockKey], success: bool) -> list[BlockKey]:
        """End a `reserve`: the chunks become ready (reported stored) or are dropped. Keys not
        being stored are ignored; returns the keys it completed."""
        table = self.table
        entries = []
        for key in keys:
            entry = table.entries.get(key)
            if entry is not None and entry.state is STORING:
                entries.append(entry)
        for entry in entries:
            if success:
                table.set_ready(entry)
            else:
                table.drop(entry)
        if success:
            self._log.stored(Tier.DISK, entries)
            for entry in entries:
                entry.token_ids = None
        return [entry.key for entry in entries]

    # -- reads ------------------------------------------------------------------------------

    def pin(self, keys: Iterable[BlockKey]) -> list[bool]:
        """Pin each ready key for a read (an access for the policy); False where not ready."""
        table = self.table
        pinned: list[bool] = []
        for key in keys:
            entry = table.ready(key)
            if entry is not None:
                table.pin(entry)
                table.policy.touch(key)
            pinned.append(entry is not None)
        return pinned

    def finish_read(self, pinned: Iterable[BlockKey]) -> None:
        """End a read: its pins go (a chunk taken out of service meanwhile is freed at its
        last pin). Chunks the read found corrupt or gone leave through `discard`."""
        table = self.table
        for key in pinned:
            entry = table.entries.get(key)
            if entry is not None and entry.num_pins > 0:
                table.unpin(entry)

    def touch(self, keys: Iterable[BlockKey]) -> None:
        table = self.table
        for key in keys:
            if table.ready(key) is not None:
                table.policy.touch(key)

    # -- removal and start ------------------------------------------------------------------

    def discard(self, keys: Iterable[BlockKey], reason: str) -> list[BlockKey]:
        """Stop serving chunks that vanished or were found corrupt (freed at their last pin)."""
        gone = self.table.take_out_of_service(keys)
        self._log.removed(Tier.DISK, gone, reason)
        return gone

    def evict_to(self, max_bytes: int, reason: str = "evicted") -> list[BlockKey]:
        """Evict unpinned ready chunks until at most `max_bytes` are used (as far as it can);
        returns them, for the caller to delete from the store."""
        if max_bytes < 0:
            raise ValueError(f"max_bytes must be >= 0, got {max_bytes}")
        table = self.table
        if table.used_bytes <= max_bytes:
            return []
        num_victims = table.victims_for(table.used_bytes - max_bytes)
        if num_victims < 0:
            num_victims = table.num_evictable
        keys = [entry.key for entry in table.evict(num_victims, frozenset()) or ()]
        self._log.removed(Tier.DISK, keys, reason)
        return keys

    def seed(self, entries: Iterable[SeedEntry]) -> list[BlockKey]:
        """Serve what the store already holds, most recently used kept; each chunk is reported
        stored. Keys already indexed are ignored. Returns what did not fit (delete it)."""
        table = self.table
        kept: list[SeedEntry] = []
        seen: set[BlockKey] = set()
        dropped: list[BlockKey] = []
        free_bytes = table.free_bytes
        for seed in sorted(entries, key=lambda s: s.last_access_s, reverse=True):
            if seed.size_bytes <= 0:
                raise ValueError(
                    f"seed: chunk {short_hex(seed.key)} has size_bytes {seed.size_bytes}; "
                    f"a stored chunk must be at least 1 byte"
                )
            if seed.key in seen or seed.key in table.entries:
                continue
            seen.add(seed.key)
            if seed.size_bytes > free_bytes:
                dropped.append(seed.key)
                continue
            free_bytes -= seed.size_bytes
            kept.append(seed)
        added: list[Entry] = []
        for seed in reversed(kept):  # oldest first: the policy's eviction order
            entry = table.add(seed.key, seed.size_bytes)
            table.set_ready(entry)
            added.append(entry)
        self._log.stored(Tier.DISK, added)
        return dropped

    def _evict(self, num_bytes: int, protected: Set[BlockKey]) -> list[BlockKey]:
        """Evict ready, unpinned chunks freeing at least `num_bytes`; [] when it cannot."""
        if num_bytes <= 0:
            return []
        table = self.table
        num_victims = table.victims_for(num_bytes, protected)
        victims = table.evict(num_victims, protected) if num_victims > 0 else None
        return [entry.key for entry in victims or ()]
