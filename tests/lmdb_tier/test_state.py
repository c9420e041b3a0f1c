"""`DiskChunks`, the tier's index, on its own: pins, removal while pinned, seeding, events."""

from __future__ import annotations

from kvstore.events import ChunkRemoved, ChunkStored, TierEvent
from kvstore.keys import BlockKey
from kvstore.vllm.lmdb_tier_state import DiskChunks
from tiers.store import EntryMeta

SLOT = 100
K = [BlockKey(bytes([i]) * 8) for i in range(6)]


def chunks(num_slots: int = 4) -> DiskChunks:
    return DiskChunks("lru", num_slots * SLOT, SLOT, num_tokens_per_chunk=16, clock=lambda: 1.0)


def stored(index: DiskChunks, keys: list[BlockKey]) -> None:
    plan = index.plan_store(keys)
    assert plan.positions == tuple(range(len(keys)))
    index.complete_store(keys, success=True)


def removed_keys(events: list[TierEvent]) -> list[BlockKey]:
    return [k for e in events if isinstance(e, ChunkRemoved) for k in e.keys]


def test_a_corrupt_chunk_pinned_by_two_reads_is_removed_once_and_freed_at_the_last() -> None:
    index = chunks()
    stored(index, [K[0]])
    index.take_events()
    assert index.pin_for_load([K[0]]) == [True]
    assert index.pin_for_load([K[0]]) == [True]
    index.complete_load([K[0]], corrupt=[K[0]])
    assert not index.is_ready(K[0])
    plan = index.plan_store([K[0], K[1]])  # K[0] is still pinned by the second read
    assert (plan.positions, plan.num_skipped) == ((1,), 1)
    index.complete_store([K[1]], success=True)
    index.complete_load([K[0]], missing=[K[0]])  # the second read found it deleted
    assert removed_keys(index.take_events()) == [K[0]]
    assert index.occupancy().num_entries == 1
    stored(index, [K[0]])  # freed: it can be stored again
    assert index.is_ready(K[0])


def test_a_failed_store_frees_its_room_and_reports_nothing() -> None:
    index = chunks(num_slots=2)
    plan = index.plan_store(K[:2])
    assert plan.positions == (0, 1)
    assert index.occupancy().used_bytes == 2 * SLOT
    index.complete_store(K[:2], success=False)
    assert index.occupancy().used_bytes == 0
    assert index.take_events() == []


def test_chunks_being_stored_are_neither_servable_nor_evictable() -> None:
    index = chunks(num_slots=2)
    index.plan_store(K[:2])
    assert not index.lookup(K[0])
    plan = index.plan_store([K[2]])
    assert (plan.positions, plan.victims, plan.num_skipped) == ((), (), 1)


def test_seed_keeps_the_most_recent_that_fit_and_returns_the_rest() -> None:
    index = chunks(num_slots=2)
    metas = [
        EntryMeta("ns", K[0], SLOT, 0, 0.0, 10.0, 0),
        EntryMeta("ns", K[1], SLOT, 0, 0.0, 30.0, 0),
        EntryMeta("ns", K[2], SLOT + 1, 0, 0.0, 40.0, 0),  # not a slot: never served
        EntryMeta("ns", K[3], SLOT, 0, 0.0, 20.0, 0),
    ]
    assert sorted(index.seed(metas)) == sorted([K[0], K[2]])
    (event,) = index.take_events()
    assert isinstance(event, ChunkStored) and event.keys == (K[3], K[1])  # oldest first
    index.end_step()
    plan = index.plan_store([K[4]])  # evicts the least recently accessed: K[3]
    assert plan.victims == (K[3],)
