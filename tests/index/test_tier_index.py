"""Each operation of the index, one behaviour at a time."""

from __future__ import annotations

import pytest

from kvstore.events import ChunkRemoved, ChunkStored
from kvstore.index import IndexStateError, TierIndex
from kvstore.keys import Tier

from .helpers import CHUNK_BYTES, k, ks, make_index, replay, store


def check(index: TierIndex) -> None:
    index.check_invariants()


# lookup


def test_lookup_on_empty_index_hits_nothing() -> None:
    result = make_index().lookup(ks(1, 2))
    assert result.keys == () and result.num_hits == 0 and not result.is_promotion_limited


def test_lookup_returns_the_contiguous_cpu_prefix() -> None:
    index = make_index()
    store(index, ks(1, 2, 4))
    result = index.lookup(ks(1, 2, 3, 4))
    assert result.keys == tuple(ks(1, 2))
    assert result.tiers == (Tier.CPU, Tier.CPU)
    assert (result.num_cpu_hits, result.num_disk_hits) == (2, 0)


def test_storing_chunks_are_not_hits() -> None:
    index = make_index()
    plan = index.prepare_store(ks(1, 2))
    assert plan is not None and plan.rows == (0, 1)
    assert index.lookup(ks(1)).num_hits == 0
    index.complete_store(plan.keys, success=True)
    assert index.lookup(ks(1, 2)).num_hits == 2


def test_lookup_prefers_cpu_and_falls_back_to_disk() -> None:
    index = make_index(num_cpu_rows=4, num_disk_chunks=8)
    store(index, ks(1, 2))
    index.plan_write_through()
    index.complete_write_through(ks(1, 2), success=True)
    store(index, ks(3, 4, 5, 6))  # evicts 1, 2 from CPU; they stay on disk
    result = index.lookup(ks(1, 2, 3, 4))
    assert result.tiers == (Tier.DISK, Tier.DISK, Tier.CPU, Tier.CPU)
    assert result.disk_keys == tuple(ks(1, 2))
    # Promoting 1 and 2 needs two rows outside the prefix: 5 and 6.
    assert index.lookup(ks(1, 2, 3, 4, 5)).keys == tuple(ks(1, 2, 3, 4))


def test_lookup_stops_where_disk_hits_could_not_be_promoted() -> None:
    index = make_index(num_cpu_rows=2, num_disk_chunks=8)
    store(index, ks(1, 2))
    write = index.plan_write_through()
    index.complete_write_through(write.keys, success=True)
    store(index, ks(3, 4))
    index.prepare_load(ks(3))  # pins one row; one row (4) is still evictable
    result = index.lookup(ks(1, 2))
    assert result.keys == (k(1),) and result.is_promotion_limited
    index.prepare_load(ks(4))
    assert index.lookup(ks(1, 2)).num_hits == 0


def test_lookup_counts_the_prefix_own_cpu_chunks_as_unevictable() -> None:
    index = make_index(num_cpu_rows=1, num_disk_chunks=8)
    store(index, ks(1))
    index.complete_write_through(index.plan_write_through(ks(1)).keys, success=True)
    store(index, ks(2))  # evicts 1 from CPU
    # Promoting 1 needs 2's row, so 2 cannot be part of the same prefix.
    result = index.lookup(ks(1, 2))
    assert result.keys == (k(1),) and result.is_promotion_limited
    assert index.lookup(ks(2, 1)).keys == (k(2),)


# prepare_store / complete_store


def test_complete_store_emits_stored_with_tokens_and_parent() -> None:
    index = make_index()
    tokens = list(range(12))
    plan = index.prepare_store(ks(1, 2, 3), token_ids=tokens, parent_key=k(0))
    assert plan is not None
    index.complete_store(plan.keys, success=True)
    [event] = index.take_events()
    assert isinstance(event, ChunkStored)
    assert event.tier is Tier.CPU and event.keys == tuple(ks(1, 2, 3))
    assert event.parent_key == k(0) and event.token_ids == tuple(tokens)
    assert event.num_tokens_per_chunk == 4
    assert index.take_events() == []


def test_store_skips_chunks_already_in_cpu_and_splits_events_by_chain() -> None:
    index = make_index()
    store(index, ks(2))
    index.take_events()
    plan = index.prepare_store(ks(1, 2, 3), token_ids=list(range(12)))
    assert plan is not None and plan.keys == (k(1), k(3))
    index.complete_store(plan.keys, success=True)
    events = index.take_events()
    assert [(e.keys, e.parent_key) for e in events if isinstance(e, ChunkStored)] == [
        ((k(1),), None),
        ((k(3),), k(2)),
    ]
    assert isinstance(events[1], ChunkStored) and events[1].token_ids == (8, 9, 10, 11)


def test_everything_present_is_an_empty_plan() -> None:
    index = make_index()
    store(index, ks(1))
    plan = index.prepare_store(ks(1))
    assert plan is not None and plan.keys == () and plan.evicted == ()


def test_failed_store_frees_rows_without_events() -> None:
    index = make_index(num_cpu_rows=2)
    plan = index.prepare_store(ks(1, 2))
    assert plan is not None
    index.complete_store(plan.keys, success=False)
    assert index.take_events() == []
    assert index.stats().cpu.num_entries == 0
    check(index)


def test_full_tier_evicts_least_recent_and_reports_it() -> None:
    index = make_index(num_cpu_rows=3)
    store(index, ks(1, 2, 3))
    index.touch(ks(1))
    index.take_events()
    plan = index.prepare_store(ks(4, 5))
    assert plan is not None and plan.evicted == (k(2), k(3))
    assert set(plan.rows) == {1, 2}
    [event] = index.take_events()
    assert isinstance(event, ChunkRemoved)
    assert (event.tier, event.keys, event.reason) == (Tier.CPU, (k(2), k(3)), "evicted")
    check(index)


def test_store_stores_the_prefix_that_fits() -> None:
    index = make_index(num_cpu_rows=3)
    store(index, ks(1))
    index.prepare_load(ks(1))
    plan = index.prepare_store(ks(2, 3, 4, 5))
    assert plan is not None and plan.keys == (k(2), k(3)) and plan.num_skipped == 2


def test_store_never_evicts_its_own_request_chunks() -> None:
    index = make_index(num_cpu_rows=2)
    store(index, ks(1, 2))
    assert index.prepare_store(ks(1, 2, 3)) is None
    plan = index.prepare_store(ks(2, 3))
    assert plan is not None and plan.evicted == (k(1),)


def test_store_returns_none_when_everything_is_pinned() -> None:
    index = make_index(num_cpu_rows=2)
    store(index, ks(1, 2))
    index.prepare_load(ks(1, 2))
    assert index.prepare_store(ks(3)) is None
    assert index.take_events()[-1:] != []  # only the earlier stored event
    check(index)


def test_prepare_store_checks_its_arguments() -> None:
    index = make_index()
    with pytest.raises(ValueError, match=r"2 keys x 4 tokens = 8, got 7"):
        index.prepare_store(ks(1, 2), token_ids=list(range(7)))
    with pytest.raises(ValueError, match="distinct"):
        index.prepare_store(ks(1, 1))


def test_complete_store_rejects_chunks_it_did_not_prepare() -> None:
    index = make_index()
    store(index, ks(1))
    with pytest.raises(IndexStateError, match=r"complete_store: chunk 00000001 is ready in cpu"):
        index.complete_store(ks(1), success=True)
    with pytest.raises(IndexStateError, match="absent"):
        index.complete_store(ks(9), success=True)


# loads


def test_load_pins_ready_chunks_and_reports_missing() -> None:
    index = make_index(num_cpu_rows=2)
    store(index, ks(1))
    plan = index.prepare_load(ks(1, 2))
    assert plan.keys == (k(1),) and plan.rows == (0,) and plan.missing == (k(2),)
    assert index.stats().cpu.num_pinned == 1
    store(index, ks(3))
    stored = index.prepare_store(ks(4))
    assert stored is not None and stored.evicted == (k(3),)  # 1 is pinned
    index.complete_load(ks(1))
    assert index.stats().cpu.num_pinned == 0


def test_complete_load_of_unpinned_chunk_is_an_error() -> None:
    index = make_index()
    store(index, ks(1))
    with pytest.raises(IndexStateError, match="not pinned"):
        index.complete_load(ks(1))


# discard


def test_discard_unpinned_chunk_reports_reason() -> None:
    index = make_index()
    store(index, ks(1, 2))
    index.take_events()
    assert index.discard(ks(1, 9), Tier.CPU, "corrupt") == (k(1),)
    [event] = index.take_events()
    assert isinstance(event, ChunkRemoved)
    assert (event.tier, event.keys, event.reason) == (Tier.CPU, (k(1),), "corrupt")
    assert index.stats().cpu.num_entries == 1


def test_discard_pinned_chunk_frees_it_at_unpin() -> None:
    index = make_index()
    store(index, ks(1))
    index.prepare_load(ks(1))
    assert index.discard(ks(1), Tier.CPU, "corrupt") == (k(1),)
    assert index.lookup(ks(1)).num_hits == 0
    assert index.stats().cpu.num_removing == 1
    check(index)
    index.complete_load(ks(1))
    stats = index.stats().cpu
    assert stats.num_entries == 0 and stats.free_bytes == stats.capacity_bytes
    assert index.discard(ks(1), Tier.CPU, "corrupt") == ()
    replay(index.take_events())


def test_discard_leaves_storing_chunks_to_their_completion() -> None:
    index = make_index()
    plan = index.prepare_store(ks(1))
    assert plan is not None
    assert index.discard(ks(1), Tier.CPU, "vanished") == ()
    assert index.discard(ks(1), Tier.DISK, "vanished") == ()  # no disk tier
    index.complete_store(plan.keys, success=True)


def test_stats_and_ready_keys() -> None:
    index = make_index(num_cpu_rows=4, num_disk_chunks=2)
    store(index, ks(1, 2))
    index.prepare_store(ks(3))
    stats = index.stats()
    assert stats.cpu.num_entries == 3 and stats.cpu.num_ready == 2 and stats.cpu.num_storing == 1
    assert stats.cpu.used_bytes == 3 * CHUNK_BYTES and stats.cpu.free_bytes == CHUNK_BYTES
    assert stats.disk is not None and stats.disk.capacity_bytes == 2 * CHUNK_BYTES
    assert stats.num_write_through_candidates == 2
    assert index.ready_keys(Tier.CPU) == frozenset(ks(1, 2))
    assert index.ready_keys(Tier.DISK) == frozenset()


# pin_rows (a remote write reads the rows; not an access)


@pytest.mark.parametrize(("verb", "evicted"), [("pin_rows", 1), ("prepare_load", 2)])
def test_pinning_rows_for_a_remote_write_leaves_the_eviction_order_alone(
    verb: str, evicted: int
) -> None:
    index = make_index(num_cpu_rows=2)
    store(index, ks(1))
    store(index, ks(2))
    plan = getattr(index, verb)(ks(1))
    assert plan.keys == (k(1),) and plan.missing == ()
    (index.unpin_rows if verb == "pin_rows" else index.complete_load)(ks(1))
    index.take_events()
    store(index, ks(3))
    removed = [e for e in index.take_events() if isinstance(e, ChunkRemoved)]
    assert [key for e in removed for key in e.keys] == [k(evicted)]
    check(index)


def test_unpin_rows_refuses_a_chunk_it_did_not_pin() -> None:
    index = make_index()
    store(index, ks(1))
    with pytest.raises(IndexStateError, match="unpin_rows"):
        index.unpin_rows(ks(1))
