"""Write-through, promotion, disk eviction, seeding and the admission filter."""

from __future__ import annotations

import pytest

from kvstore.events import ChunkRemoved, ChunkStored
from kvstore.index import IndexStateError, SeedEntry
from kvstore.keys import Tier

from .helpers import CHUNK_BYTES, k, ks, make_index, replay, store, take_candidates, write_through


def test_ready_cpu_chunks_become_write_through_candidates() -> None:
    index = make_index(num_disk_chunks=4)
    plan = index.prepare_store(ks(1, 2), token_ids=list(range(8)), parent_key=k(0))
    assert plan is not None
    assert take_candidates(index) == []
    index.complete_store(plan.keys, success=True)
    assert take_candidates(index) == ks(1, 2)
    assert take_candidates(index) == []


def test_write_through_pins_rows_then_reports_disk_stored() -> None:
    index = make_index(num_cpu_rows=2, num_disk_chunks=4)
    plan = index.prepare_store(ks(1, 2), token_ids=list(range(8)), parent_key=k(0))
    assert plan is not None
    index.complete_store(plan.keys, success=True)
    index.take_events()
    write = index.plan_write_through()
    assert write.keys == tuple(ks(1, 2)) and write.rows == plan.rows and write.evicted == ()
    assert index.stats().cpu.num_pinned == 2
    assert index.prepare_store(ks(3)) is None  # both rows pinned by the write
    assert index.lookup(ks(1)).tiers == (Tier.CPU,)  # still served from CPU meanwhile
    index.complete_write_through(write.keys, success=True)
    [event] = index.take_events()
    assert isinstance(event, ChunkStored) and event.tier is Tier.DISK
    assert event.keys == tuple(ks(1, 2)) and event.parent_key == k(0)
    assert event.token_ids == tuple(range(8))
    assert index.stats().cpu.num_pinned == 0
    assert index.ready_keys(Tier.DISK) == frozenset(ks(1, 2))
    index.check_invariants()


def test_write_through_ignores_chunks_on_disk_or_not_ready() -> None:
    index = make_index(num_disk_chunks=4)
    store(index, ks(1))
    write_through(index)
    index.prepare_store(ks(2))
    assert index.plan_write_through(ks(1, 2, 3)).keys == ()


def test_failed_write_through_drops_the_disk_entry_silently() -> None:
    index = make_index(num_disk_chunks=4)
    store(index, ks(1))
    index.take_events()
    write = index.plan_write_through(ks(1))
    index.complete_write_through(write.keys, success=False)
    assert index.take_events() == []
    stats = index.stats()
    assert stats.disk is not None and stats.disk.used_bytes == 0 and stats.cpu.num_pinned == 0
    assert index.plan_write_through(ks(1)).keys == (k(1),)  # can be tried again


def test_full_disk_evicts_by_bytes_and_reports_victims() -> None:
    index = make_index(num_cpu_rows=4, num_disk_chunks=2)
    store(index, ks(1, 2))
    write_through(index)
    index.touch(ks(1))
    store(index, ks(3))
    index.take_events()
    write = index.plan_write_through()
    assert write.keys == (k(3),) and write.evicted == (k(2),)
    [event] = index.take_events()
    assert isinstance(event, ChunkRemoved) and event.tier is Tier.DISK and event.keys == (k(2),)
    index.complete_write_through(write.keys, success=True)
    assert index.ready_keys(Tier.DISK) == frozenset(ks(1, 3))


def test_write_through_skips_what_cannot_fit() -> None:
    index = make_index(num_cpu_rows=4, num_disk_chunks=1)
    store(index, ks(1, 2, 3))
    write = index.plan_write_through(ks(1, 2, 3))
    assert write.keys == (k(1),) and write.skipped == (k(2), k(3))
    index.check_invariants()


def test_write_through_without_disk_tier_is_empty() -> None:
    index = make_index()
    store(index, ks(1))
    assert take_candidates(index) == []
    assert index.plan_write_through(ks(1)).keys == ()


def test_complete_write_through_rejects_unknown_writes() -> None:
    index = make_index(num_disk_chunks=2)
    store(index, ks(1))
    with pytest.raises(IndexStateError, match="no write-through in flight"):
        index.complete_write_through(ks(1), success=True)


def test_promotion_holds_prefix_until_release() -> None:
    index = make_index(num_cpu_rows=3, num_disk_chunks=8)
    store(index, ks(1, 2))
    write_through(index)
    store(index, ks(3, 4, 5))  # 1, 2 leave CPU (3 rows)
    write_through(index)
    index.touch(ks(5))
    lookup = index.lookup(ks(1, 2, 5))
    assert lookup.tiers == (Tier.DISK, Tier.DISK, Tier.CPU)
    plan = index.plan_promotion(lookup.keys)
    assert plan.keys == tuple(ks(1, 2)) and plan.held == (k(5),)
    assert plan.evicted == (k(3), k(4)) and plan.num_skipped == 0
    assert index.lookup(ks(1)).num_hits == 0  # CPU entry storing: not servable yet
    index.complete_promotion(plan.keys, success=True)
    load = index.prepare_load(lookup.keys)
    assert load.missing == () and set(load.rows) == {0, 1, 2}
    assert index.release(lookup.keys) == 3
    assert index.release(lookup.keys) == 0
    index.complete_load(lookup.keys)
    stats = index.stats()
    assert stats.cpu.num_pinned == 0 and stats.num_holds == 0 and stats.num_promoting == 0
    members = replay(index.take_events())
    assert members[Tier.CPU] == index.ready_keys(Tier.CPU) == frozenset(ks(1, 2, 5))
    index.check_invariants()


def test_promoted_chunk_stays_held_after_completion() -> None:
    index = make_index(num_cpu_rows=1, num_disk_chunks=4)
    store(index, ks(1))
    write_through(index)
    store(index, ks(2))
    plan = index.plan_promotion(ks(1))
    index.complete_promotion(plan.keys, success=True)
    assert index.prepare_store(ks(3)) is None  # the held row cannot be evicted
    index.release(ks(1))
    stored = index.prepare_store(ks(3))
    assert stored is not None and stored.evicted == (k(1),)


def test_failed_promotion_frees_rows_and_holds() -> None:
    index = make_index(num_cpu_rows=2, num_disk_chunks=4)
    store(index, ks(1))
    write_through(index)
    index.discard(ks(1), Tier.CPU, "test")
    index.take_events()
    plan = index.plan_promotion(ks(1))
    assert plan.rows == (0,)
    index.complete_promotion(plan.keys, success=False)
    assert index.take_events() == []
    stats = index.stats()
    assert stats.cpu.num_entries == 0 and stats.num_holds == 0
    assert stats.disk is not None and stats.disk.num_pinned == 0
    assert index.release(ks(1)) == 0
    index.check_invariants()


def test_disk_entry_is_pinned_while_promotion_reads_it() -> None:
    index = make_index(num_cpu_rows=2, num_disk_chunks=1)
    store(index, ks(1))
    write_through(index)
    index.discard(ks(1), Tier.CPU, "test")
    plan = index.plan_promotion(ks(1))
    assert index.evict_disk_to(0) == []
    store(index, ks(2))
    assert index.plan_write_through(ks(2)).skipped == (k(2),)
    # Discarding it now takes it out of service; it is freed when the read ends.
    assert index.discard(ks(1), Tier.DISK, "corrupt") == (k(1),)
    index.complete_promotion(plan.keys, success=False)
    disk = index.stats().disk
    assert disk is not None and disk.num_entries == 0
    index.check_invariants()


def test_promotion_stops_where_rows_run_out() -> None:
    index = make_index(num_cpu_rows=2, num_disk_chunks=8)
    store(index, ks(1, 2))
    write_through(index)
    index.discard(ks(1, 2), Tier.CPU, "test")
    store(index, ks(3))
    index.prepare_load(ks(3))
    plan = index.plan_promotion(ks(1, 2))
    assert plan.keys == (k(1),) and plan.num_skipped == 1


def test_complete_promotion_rejects_unknown_promotions() -> None:
    index = make_index(num_disk_chunks=2)
    with pytest.raises(IndexStateError, match="no promotion in flight"):
        index.complete_promotion(ks(1), success=True)


def test_evict_disk_to_frees_least_recent_first() -> None:
    index = make_index(num_cpu_rows=4, num_disk_chunks=4)
    store(index, ks(1, 2, 3))
    write_through(index)
    index.take_events()
    index.touch(ks(1))
    assert index.evict_disk_to(CHUNK_BYTES, reason="gc") == ks(2, 3)
    [event] = index.take_events()
    assert isinstance(event, ChunkRemoved) and event.reason == "gc"
    assert index.evict_disk_to(CHUNK_BYTES) == []
    with pytest.raises(ValueError, match="max_bytes must be >= 0, got -1"):
        index.evict_disk_to(-1)


def test_seed_disk_keeps_most_recent_and_orders_policy_by_access() -> None:
    index = make_index(num_cpu_rows=2, num_disk_chunks=3)
    seeds = [
        SeedEntry(k(i), CHUNK_BYTES, last_access_s=float(t))
        for i, t in [(1, 30), (2, 10), (3, 40), (4, 20)]
    ]
    assert index.seed_disk(seeds) == [k(2)]
    assert index.ready_keys(Tier.DISK) == frozenset(ks(1, 3, 4))
    events = index.take_events()
    assert [event.keys for event in events] == [(k(4),), (k(1),), (k(3),)]
    assert all(isinstance(event, ChunkStored) and event.tier is Tier.DISK for event in events)
    assert index.lookup(ks(4)).tiers == (Tier.DISK,)
    assert index.evict_disk_to(CHUNK_BYTES) == ks(4, 1)


def test_seed_disk_validates() -> None:
    with pytest.raises(IndexStateError, match="no disk tier"):
        make_index().seed_disk([])
    with pytest.raises(ValueError, match="size_bytes 0"):
        make_index(num_disk_chunks=1).seed_disk([SeedEntry(k(1), 0, 0.0)])


def test_admission_filter_writes_only_after_enough_sightings() -> None:
    index = make_index(num_disk_chunks=4, admission_min_sightings=2)
    index.lookup(ks(1, 2))
    store(index, ks(1, 2))
    assert take_candidates(index) == []
    index.lookup(ks(1))
    assert take_candidates(index) == [k(1)]
    index.lookup(ks(1))  # a third sighting does not make it a candidate again
    assert take_candidates(index) == []
    index.lookup(ks(3))
    index.lookup(ks(3))
    store(index, ks(3))
    assert take_candidates(index) == [k(3)]
