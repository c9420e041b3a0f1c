"""`TierIndex`: which chunk is in which tier, and the two-phase operations that move them."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from kvstore.events import TierEvent
from kvstore.index.errors import IndexStateError
from kvstore.index.invariants import check_index
from kvstore.index.plans import IndexStats, LoadPlan, LookupResult, StorePlan, TierStats
from kvstore.index.promotion import PromotionOps
from kvstore.index.table import READY, STORING, Entry, EntryState, TierTable
from kvstore.index.write_through import WriteThroughOps
from kvstore.keys import BlockKey, Tier, short_hex

__all__ = ["TierIndex"]


class TierIndex(PromotionOps, WriteThroughOps):
    """The single authority on which chunk is in which tier (CPU rows, disk bytes).

    Threading: NOT thread-safe. Its owner — vLLM's scheduler thread, through the connector —
    serializes every call; other threads (the tier service, workers) report completions to that
    owner, which calls `complete_*`. No call blocks or does I/O.

    Per tier, an entry is `storing` → `ready` → (`removing` →) dropped, with a pin count; only a
    ready, unpinned entry is evictable, by that tier's policy. Every `prepare_*`/`plan_*` that
    reserves space or pins is ended by its `complete_*` (and a promotion's holds by `release`).

    Events (`take_events`): a chunk is reported stored in a tier when it becomes ready there and
    removed when it stops being served there (evicted, discarded), at most once per store, so
    replaying them from empty reproduces each tier's ready membership.
    """

    def lookup(self, keys: Sequence[BlockKey]) -> LookupResult:
        """The longest prefix of `keys` available in CPU or disk; changes nothing but sightings."""
        if self._sightings is not None:
            self._note_sightings(keys)
        tiers, is_limited = self._servable_prefix(keys)
        num_cpu_hits = tiers.count(Tier.CPU)
        return LookupResult(
            keys=tuple(keys[: len(tiers)]),
            tiers=tuple(tiers),
            num_cpu_hits=num_cpu_hits,
            num_disk_hits=len(tiers) - num_cpu_hits,
            is_promotion_limited=is_limited,
        )

    def prepare_store(
        self,
        keys: Sequence[BlockKey],
        *,
        token_ids: Sequence[int] | None = None,
        parent_key: BlockKey | None = None,
    ) -> StorePlan | None:
        """Reserve CPU rows for the keys not yet in CPU, evicting if needed.

        `keys` are one request's chunks in prefix order; `token_ids` (when given) cover them all,
        `parent_key` is the chunk before `keys[0]`. Stores the longest run of missing keys that
        fits; the request's own ready chunks are never evicted for it. Returns None when nothing
        can be stored, an empty plan when everything is already in CPU.
        """
        self._check_token_ids(keys, token_ids)
        request = _unique(keys, "prepare_store")
        missing, num_own_evictable = self._missing_from_cpu(keys)
        if not missing:
            return StorePlan(keys=(), rows=())
        cpu = self._cpu
        num_free = len(cpu.free_rows)
        num_store = min(len(missing), num_free + cpu.num_evictable - num_own_evictable)
        if num_store <= 0:
            return None
        evicted = self._evict_cpu(num_store - num_free, request) if num_store > num_free else []
        stored = missing[:num_store]
        rows = self._add_storing(keys, stored, token_ids, parent_key)
        return StorePlan(
            keys=tuple(keys[i] for i in stored),
            rows=tuple(rows),
            evicted=tuple(evicted),
            num_skipped=len(missing) - num_store,
        )

    def _check_token_ids(self, keys: Sequence[BlockKey], token_ids: Sequence[int] | None) -> None:
        num_tokens = self._config.num_tokens_per_chunk
        if token_ids is not None and len(token_ids) != len(keys) * num_tokens:
            raise ValueError(
                f"token_ids must cover the keys: {len(keys)} keys x {num_tokens} tokens = "
                f"{len(keys) * num_tokens}, got {len(token_ids)}"
            )

    def _missing_from_cpu(self, keys: Sequence[BlockKey]) -> tuple[list[int], int]:
        """Positions of the keys CPU lacks, and how many of the others are evictable."""
        entries = self._cpu.entries
        missing: list[int] = []
        num_evictable = 0
        for i, key in enumerate(keys):
            entry = entries.get(key)
            if entry is None:
                missing.append(i)
            elif entry.state is READY and entry.num_pins == 0:
                num_evictable += 1
        return missing, num_evictable

    def _add_storing(
        self,
        keys: Sequence[BlockKey],
        positions: Sequence[int],
        token_ids: Sequence[int] | None,
        parent_key: BlockKey | None,
    ) -> list[int]:
        """New `storing` CPU entries for `keys[i]`, i in `positions`; returns their rows."""
        num_tokens = self._config.num_tokens_per_chunk
        add = self._cpu.add
        rows: list[int] = []
        for i in positions:
            tokens = None
            if token_ids is not None:
                tokens = tuple(token_ids[i * num_tokens : (i + 1) * num_tokens])
            rows.append(add(keys[i], keys[i - 1] if i > 0 else parent_key, tokens).row)
        return rows

    def complete_store(self, keys: Sequence[BlockKey], success: bool) -> None:
        """End a `prepare_store`: the chunks become ready in CPU, or their rows are freed.

        A chunk that becomes ready joins the write-through candidates unless it is already on disk
        or the admission filter has not seen it often enough yet.
        """
        cpu = self._cpu
        entries = [self._storing_entry(cpu, key, "complete_store") for key in keys]
        if not success:
            for entry in entries:
                cpu.drop(entry)
            return
        for entry in entries:
            cpu.set_ready(entry)
        self._emit_stored(Tier.CPU, entries)
        candidates = self._candidates
        for entry in entries:
            if self._is_write_candidate(entry.key):
                candidates[entry.key] = None
            else:
                entry.token_ids = None

    def prepare_load(self, keys: Iterable[BlockKey]) -> LoadPlan:
        """Pin the chunks ready in CPU for a CPU→engine copy (and count it as an access).

        Keys not ready in CPU are returned as `missing` (promote them first, or recompute).
        """
        return self._pin_ready(keys, is_access=True)

    def complete_load(self, keys: Iterable[BlockKey]) -> None:
        """End a `prepare_load`: unpin the chunks (a discarded one is freed now)."""
        self._unpin(keys, "complete_load")

    def pin_rows(self, keys: Iterable[BlockKey]) -> LoadPlan:
        """Pin the rows of chunks ready in CPU while a copy reads them out of kvstore (a write
        to the remote tier): not an access, so the eviction order stays as it was. Keys not
        ready are `missing`. Release with `unpin_rows`."""
        return self._pin_ready(keys, is_access=False)

    def unpin_rows(self, keys: Iterable[BlockKey]) -> None:
        """End a `pin_rows` (a discarded chunk is freed now)."""
        self._unpin(keys, "unpin_rows")

    def _pin_ready(self, keys: Iterable[BlockKey], *, is_access: bool) -> LoadPlan:
        cpu = self._cpu
        touch = cpu.policy.touch
        pinned: list[BlockKey] = []
        rows: list[int] = []
        missing: list[BlockKey] = []
        for key in keys:
            entry = cpu.entries.get(key)
            if entry is None or entry.state is not READY:
                missing.append(key)
                continue
            cpu.pin(entry)
            if is_access:
                touch(key)
            pinned.append(key)
            rows.append(entry.row)
        return LoadPlan(keys=tuple(pinned), rows=tuple(rows), missing=tuple(missing))

    def _unpin(self, keys: Iterable[BlockKey], verb: str) -> None:
        cpu = self._cpu
        entries = [self._pinned_entry(cpu, key, verb) for key in keys]
        for entry in entries:
            cpu.unpin(entry)

    def touch(self, keys: Iterable[BlockKey]) -> None:
        """Record an access to each key in every tier where it is ready."""
        tables: list[TierTable] = [self._cpu] if self._disk is None else [self._cpu, self._disk]
        for key in keys:
            for table in tables:
                entry = table.entries.get(key)
                if entry is not None and entry.state is READY:
                    table.policy.touch(key)

    def discard(self, keys: Iterable[BlockKey], tier: Tier, reason: str) -> tuple[BlockKey, ...]:
        """Stop serving chunks of `tier` that vanished or were found corrupt.

        Ready entries leave service now (reported removed with `reason`); an unpinned one is freed
        at once, a pinned one when its last pin goes. Storing entries are left to their
        `complete_*`. Returns the keys taken out of service.
        """
        if tier is Tier.DISK:
            return () if self._disk_index is None else tuple(self._disk_index.discard(keys, reason))
        if tier is not Tier.CPU:
            return ()  # the remote tier is not indexed here
        gone = self._cpu.take_out_of_service(keys)
        for key in gone:
            self._candidates.pop(key, None)
        self._emit_removed(tier, gone, reason)
        return tuple(gone)

    def take_events(self) -> list[TierEvent]:
        """The events since the last call, oldest first."""
        return self._log.take()

    def stats(self) -> IndexStats:
        return IndexStats(
            cpu=_tier_stats(self._cpu),
            disk=None if self._disk is None else _tier_stats(self._disk),
            num_holds=sum(self._holds.values()),
            num_promoting=len(self._promoting),
            num_write_through_candidates=len(self._candidates),
        )

    def state_of(self, tier: Tier, key: BlockKey) -> EntryState | None:
        """The state of `key` in `tier`; None when the tier does not hold it (the remote tier
        is not indexed here: Redis owns its placement)."""
        table = self._table(tier)
        entry = None if table is None else table.entries.get(key)
        return None if entry is None else entry.state

    def ready_keys(self, tier: Tier) -> frozenset[BlockKey]:
        """The keys ready in `tier`. O(entries): for tests and tools, not the step path."""
        table = self._table(tier)
        if table is None:
            return frozenset()
        return frozenset(key for key, entry in table.entries.items() if entry.state is READY)

    def _table(self, tier: Tier) -> TierTable | None:
        return {Tier.CPU: self._cpu, Tier.DISK: self._disk}.get(tier)

    def check_invariants(self) -> None:
        """Raise `InvariantError` naming the first broken invariant. O(entries): for tests."""
        check_index(self._cpu, self._disk, self._holds, self._promoting)

    def _note_sightings(self, keys: Sequence[BlockKey]) -> None:
        assert self._sightings is not None
        for key in self._sightings.record(keys):
            if self._cpu.ready(key) is not None and self._is_write_candidate(key):
                self._candidates[key] = None

    def _storing_entry(self, table: TierTable, key: BlockKey, operation: str) -> Entry:
        entry = table.entries.get(key)
        if entry is None or entry.state is not STORING or key in self._promoting:
            state = "absent" if entry is None else entry.state
            raise IndexStateError(
                f"{operation}: chunk {short_hex(key)} is {state} in {table.tier}; "
                f"only a chunk it prepared (storing) can be completed"
            )
        return entry

    def _pinned_entry(self, table: TierTable, key: BlockKey, operation: str) -> Entry:
        entry = table.entries.get(key)
        if entry is None or entry.num_pins == 0:
            raise IndexStateError(
                f"{operation}: chunk {short_hex(key)} is not pinned in {table.tier}; "
                f"only a chunk it prepared can be completed"
            )
        return entry


def _unique(keys: Sequence[BlockKey], operation: str) -> frozenset[BlockKey]:
    unique = frozenset(keys)
    if len(unique) != len(keys):
        raise ValueError(
            f"{operation}: keys must be distinct, got {len(keys) - len(unique)} repeats"
        )
    return unique


def _tier_stats(table: TierTable) -> TierStats:
    return TierStats(
        tier=table.tier,
        num_entries=len(table.entries),
        num_ready=len(table.entries) - table.num_storing - table.num_removing,
        num_storing=table.num_storing,
        num_removing=table.num_removing,
        num_pinned=table.num_pinned,
        num_evictable=table.num_evictable,
        used_bytes=table.used_bytes,
        free_bytes=table.free_bytes,
        capacity_bytes=table.capacity_bytes,
    )
