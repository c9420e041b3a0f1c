"""`DiskChunks`: which chunks `LMDBTier` holds, their pins and eviction, and the events.

Pure bookkeeping on kvstore's `DiskTable` (entries `storing` → `ready` → (`removing` →) dropped,
pins, size accounting by bytes under an LRU/ARC policy); the I/O runs elsewhere and reports back.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Sequence, Set
from dataclasses import dataclass

from kvstore.events import ChunkRemoved, ChunkStored, TierEvent
from kvstore.index.table import REMOVING, STORING, DiskTable
from kvstore.keys import BlockKey, Tier
from kvstore.metrics import Occupancy
from kvstore.policies import make_policy
from tiers.store import EntryMeta

__all__ = ["DiskChunks", "StorePlan"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class StorePlan:
    """What a store job writes: `positions` index the job's keys (now `storing`); `victims` were
    evicted to make room (delete them first); `num_skipped` new keys did not fit."""

    positions: tuple[int, ...]
    victims: tuple[BlockKey, ...]
    num_skipped: int


class DiskChunks:
    """The LMDB tier's index: one `DiskTable` sized in bytes, and its pending events.

    Threading: NOT thread-safe and does no I/O; vLLM's scheduler thread owns it through
    `LMDBTier`. Only ready, unpinned chunks are evicted, and not those a lookup found this step
    (their promotion is submitted at the end of the step, when `pin_for_load` pins them).

    Events (`take_events`): a chunk is reported stored when it becomes ready (or is found on disk
    at start) and removed when it stops being served (evicted, corrupt, deleted by another
    process), at most once per store.
    """

    def __init__(
        self,
        policy: str,
        capacity_bytes: int,
        slot_bytes: int,
        num_tokens_per_chunk: int,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        num_chunks = max(1, capacity_bytes // slot_bytes)
        self._table = DiskTable(make_policy(policy, num_chunks), capacity_bytes)
        self._slot_bytes = slot_bytes
        self._num_tokens_per_chunk = num_tokens_per_chunk
        self._clock = clock
        self._events: list[TierEvent] = []
        self._looked_up: set[BlockKey] = set()

    # -- queries ------------------------------------------------------------------------------

    def is_ready(self, key: BlockKey) -> bool:
        return self._table.ready(key) is not None

    def lookup(self, key: BlockKey) -> bool:
        """Whether `key` is servable; a hit is kept from eviction until `end_step`."""
        if self._table.ready(key) is None:
            return False
        self._looked_up.add(key)
        return True

    def touch(self, keys: Iterable[BlockKey]) -> None:
        table = self._table
        for key in keys:
            if table.ready(key) is not None:
                table.policy.touch(key)

    def end_step(self) -> None:
        """The step's promotions are submitted (and pinned): lookup hits may be evicted again."""
        self._looked_up.clear()

    def occupancy(self) -> Occupancy:
        """How full the tier is (read from the metrics thread: plain ints, no lock needed)."""
        table = self._table
        return Occupancy(
            used_bytes=table.used_bytes,
            capacity_bytes=table.capacity_bytes,
            num_entries=len(table.entries),
        )

    def take_events(self) -> list[TierEvent]:
        events, self._events = self._events, []
        return events

    # -- start --------------------------------------------------------------------------------

    def seed(self, metas: Iterable[EntryMeta]) -> list[bytes]:
        """Serve what the store already holds, most recently used kept; returns the keys to
        delete (a value of the wrong size, or beyond the capacity)."""
        table = self._table
        doomed: list[bytes] = []
        kept: list[EntryMeta] = []
        free_bytes = table.free_bytes
        for meta in sorted(metas, key=lambda m: m.last_access_s, reverse=True):
            if meta.size_bytes != self._slot_bytes or meta.size_bytes > free_bytes:
                doomed.append(meta.key)
                continue
            free_bytes -= meta.size_bytes
            kept.append(meta)
        for meta in reversed(kept):  # oldest first: the policy's eviction order
            table.set_ready(table.add(BlockKey(meta.key), meta.size_bytes))
        self._emit_stored([BlockKey(meta.key) for meta in reversed(kept)])
        return doomed

    # -- stores -------------------------------------------------------------------------------

    def plan_store(self, keys: Sequence[BlockKey]) -> StorePlan:
        """Reserve room for the keys not held yet (`storing`), evicting by the policy.

        Keys already held are left alone, and so are repeats. Evicts what the whole batch needs
        at once, key by key only when that cannot be done; keys that still do not fit, or that
        are leaving (corrupt, still pinned), are skipped.
        """
        table = self._table
        new: list[int] = []
        held: set[BlockKey] = set()
        num_leaving = 0  # out of service, still pinned by a read: cannot be stored again yet
        for i, key in enumerate(keys):
            if key in held:
                continue
            held.add(key)
            entry = table.entries.get(key)
            if entry is None:
                new.append(i)
            elif entry.state is REMOVING:
                num_leaving += 1
        protected = self._looked_up | held
        slot = self._slot_bytes
        victims = self._evict(len(new) * slot - table.free_bytes, protected)
        planned: list[int] = []
        for i in new:
            if table.free_bytes < slot:
                victims += self._evict(slot - table.free_bytes, protected)
            if table.free_bytes < slot:
                break
            table.add(keys[i], slot)
            planned.append(i)
        self._emit_removed(victims, "evicted")
        return StorePlan(tuple(planned), tuple(victims), len(new) - len(planned) + num_leaving)

    def complete_store(self, keys: Iterable[BlockKey], *, success: bool) -> None:
        """End a `plan_store` for `keys`: they become ready (reported stored) or are dropped."""
        table = self._table
        ready: list[BlockKey] = []
        for key in keys:
            entry = table.entries.get(key)
            if entry is None or entry.state is not STORING:
                logger.warning("LMDBTier: chunk %s was not being stored", key.hex()[:12])
                continue
            if success:
                table.set_ready(entry)
                ready.append(key)
            else:
                table.drop(entry)
        self._emit_stored(ready)

    # -- loads --------------------------------------------------------------------------------

    def pin_for_load(self, keys: Iterable[BlockKey]) -> list[bool]:
        """Pin each ready key for a read (an access for the policy); False where not ready."""
        table = self._table
        pinned: list[bool] = []
        for key in keys:
            entry = table.ready(key)
            if entry is not None:
                table.pin(entry)
                table.policy.touch(key)
            pinned.append(entry is not None)
        return pinned

    def complete_load(
        self,
        pinned: Iterable[BlockKey],
        *,
        corrupt: Sequence[BlockKey] = (),
        missing: Sequence[BlockKey] = (),
    ) -> None:
        """End a read: corrupt and vanished chunks leave service (reported removed once), then
        the read's pins go (a chunk out of service is freed at its last pin)."""
        self._discard(corrupt, "corrupt")
        self._discard(missing, "deleted")
        table = self._table
        for key in pinned:
            entry = table.entries.get(key)
            if entry is not None and entry.num_pins > 0:
                table.unpin(entry)

    # -- internals ----------------------------------------------------------------------------

    def _evict(self, num_bytes: int, protected: Set[BlockKey]) -> list[BlockKey]:
        """Evict ready, unpinned chunks freeing at least `num_bytes`; [] when it cannot."""
        if num_bytes <= 0:
            return []
        table = self._table
        num_victims = table.victims_for(num_bytes, protected)
        victims = table.evict(num_victims, protected) if num_victims > 0 else None
        return [entry.key for entry in victims or ()]

    def _discard(self, keys: Sequence[BlockKey], reason: str) -> None:
        self._emit_removed(self._table.take_out_of_service(keys), reason)

    def _emit_stored(self, keys: Sequence[BlockKey]) -> None:
        if keys:
            self._events.append(
                ChunkStored(Tier.DISK, tuple(keys), self._num_tokens_per_chunk, self._clock())
            )

    def _emit_removed(self, keys: Sequence[BlockKey], reason: str) -> None:
        if keys:
            self._events.append(ChunkRemoved(Tier.DISK, tuple(keys), self._clock(), reason))
