"""`DiskIndex` on its own (as `LMDBTier` drives it): reservations, pins, removal while pinned,
protected keys, seeding, events. Ported from the tests of LMDBTier's former `DiskChunks`."""

from __future__ import annotations

from kvstore.events import ChunkRemoved, ChunkStored, TierEvent
from kvstore.index.disk import DiskCandidate, DiskIndex, DiskReservation
from kvstore.index.event_log import EventLog
from kvstore.index.plans import SeedEntry
from kvstore.keys import BlockKey

SLOT = 100
K = [BlockKey(bytes([i]) * 8) for i in range(6)]


def make(num_slots: int = 4) -> tuple[DiskIndex, EventLog]:
    log = EventLog(num_tokens_per_chunk=16, clock=lambda: 1.0)
    return DiskIndex("lru", num_slots * SLOT, SLOT, log), log


def reserve(
    index: DiskIndex, keys: list[BlockKey], protected: frozenset[BlockKey] = frozenset()
) -> DiskReservation:
    return index.reserve((DiskCandidate(key) for key in keys), protected)


def stored(index: DiskIndex, keys: list[BlockKey]) -> None:
    assert reserve(index, keys).keys == tuple(keys)
    assert index.complete(keys, True) == keys


def removed_keys(events: list[TierEvent]) -> list[BlockKey]:
    return [k for e in events if isinstance(e, ChunkRemoved) for k in e.keys]


def test_a_corrupt_chunk_pinned_by_two_reads_is_removed_once_and_freed_at_the_last() -> None:
    index, log = make()
    stored(index, [K[0]])
    log.take()
    assert index.pin([K[0]]) == [True]
    assert index.pin([K[0]]) == [True]
    index.discard([K[0]], "corrupt")
    index.finish_read([K[0]])
    assert not index.is_ready(K[0])
    plan = reserve(index, [K[0], K[1]])  # K[0] is still pinned by the second read
    assert (plan.keys, plan.skipped) == ((K[1],), (K[0],))
    index.complete([K[1]], True)
    index.discard([K[0]], "deleted")  # the second read found it deleted: already out
    index.finish_read([K[0]])
    assert removed_keys(log.take()) == [K[0]]
    assert index.occupancy().num_entries == 1
    stored(index, [K[0]])  # freed: it can be stored again
    assert index.is_ready(K[0])


def test_a_failed_store_frees_its_room_and_reports_nothing() -> None:
    index, log = make(num_slots=2)
    assert reserve(index, K[:2]).keys == (K[0], K[1])
    assert index.occupancy().used_bytes == 2 * SLOT
    assert index.complete(K[:2], False) == K[:2]
    assert index.occupancy().used_bytes == 0
    assert log.take() == []


def test_chunks_being_stored_are_neither_servable_nor_evictable() -> None:
    index, _ = make(num_slots=2)
    reserve(index, K[:2])
    assert not index.is_ready(K[0])
    assert index.pin([K[0]]) == [False]
    plan = reserve(index, [K[2]])
    assert (plan.keys, plan.evicted, plan.skipped) == ((), (), (K[2],))


def test_keys_already_held_or_repeated_are_not_reserved_again() -> None:
    index, _ = make()
    stored(index, [K[0]])
    plan = reserve(index, [K[0], K[1], K[1]])
    assert (plan.keys, plan.skipped) == ((K[1],), ())
    assert reserve(index, [K[1]]).keys == ()  # still being stored


def test_protected_chunks_are_not_evicted() -> None:
    """LMDBTier's rule: a lookup hit is not evicted before its load is submitted."""
    index, log = make(num_slots=2)
    stored(index, K[:2])
    log.take()
    plan = reserve(index, [K[2]], protected=frozenset(K[:2]))
    assert (plan.keys, plan.evicted, plan.skipped) == ((), (), (K[2],))
    assert log.take() == []
    plan = reserve(index, [K[2]], protected=frozenset([K[0]]))
    assert (plan.keys, plan.evicted) == ((K[2],), (K[1],))
    assert removed_keys(log.take()) == [K[1]]


def test_a_pinned_chunk_is_not_evicted() -> None:
    index, _ = make(num_slots=2)
    stored(index, K[:2])
    index.pin([K[0]])
    assert reserve(index, [K[2]]).evicted == (K[1],)
    index.finish_read([K[0]])
    assert index.is_ready(K[0])


def test_seed_keeps_the_most_recent_that_fit_and_returns_the_rest() -> None:
    index, log = make(num_slots=2)
    seeds = [
        SeedEntry(K[0], SLOT, 10.0),
        SeedEntry(K[1], SLOT, 30.0),
        SeedEntry(K[2], SLOT, 5.0),
        SeedEntry(K[3], SLOT, 20.0),
    ]
    assert sorted(index.seed(seeds)) == sorted([K[0], K[2]])
    events = log.take()
    assert all(isinstance(e, ChunkStored) for e in events)
    assert [k for e in events for k in e.keys] == [K[3], K[1]]  # oldest first
    plan = reserve(index, [K[4]])  # evicts the least recently accessed: K[3]
    assert plan.evicted == (K[3],)
