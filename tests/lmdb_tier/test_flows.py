"""LMDBTier driven as vLLM's tiering manager drives it: stores, lookups, loads, eviction, events,
restart."""

from __future__ import annotations

import numpy as np
from vllm.v1.kv_offload.base import LookupResult, Medium, ReqContext, ScheduleEndContext

from kvstore.vllm import LMDBTier

from .helpers import SLOT_BYTES, TOKENS_PER_BLOCK, Harness, finish, job, key, metric
from .helpers import stored_and_removed as split

CTX = ReqContext(req_id="lookup")
STEP_END = ScheduleEndContext(new_req_ids=(), preempted_req_ids=())


def lookups(tier: LMDBTier, indices: range) -> list[LookupResult]:
    return [tier.lookup(key(i), CTX) for i in indices]


def test_store_lookup_load_round_trip_is_byte_exact(harness: Harness) -> None:
    tier = harness.open()
    assert tier.medium is Medium.STORAGE
    assert lookups(tier, range(3)) == [LookupResult.MISS] * 3
    values = harness.store(tier, 1, 0, 3)
    assert lookups(tier, range(4)) == [LookupResult.HIT] * 3 + [LookupResult.MISS]
    assert not tier.has_pending_work()

    harness.primary[8:11] = 0
    tier.submit_load(job(2, [key(2), key(0)], [8, 10], is_promotion=True))
    result = finish(tier, 2)[2]
    assert result.success and result.successful_keys is None
    assert result.transfer_bytes == 2 * SLOT_BYTES
    assert harness.primary[8].tobytes() == values[key(2)]
    assert harness.primary[10].tobytes() == values[key(0)]
    assert not harness.primary[9].any()  # untouched
    assert metric(tier, "kvstore_transfer_bytes_total", direction="disk_to_cpu") == 2 * SLOT_BYTES
    assert metric(tier, "kvstore_transfer_bytes_total", direction="cpu_to_disk") == 3 * SLOT_BYTES
    assert metric(tier, "kvstore_hit_chunks_total", tier="disk") == 3
    assert metric(tier, "kvstore_hit_tokens_total", tier="disk") == 3 * TOKENS_PER_BLOCK


def test_stored_chunks_are_reported_as_storage_events(harness: Harness) -> None:
    tier = harness.open()
    harness.store(tier, 1, 0, 2)
    events = list(tier.take_events())
    assert [(e.medium, e.removed, e.ownership, e.removal_expected) for e in events] == [
        (Medium.STORAGE, False, "LMDBTier", True)
    ]
    assert events[0].keys == [key(0), key(1)]
    assert list(tier.take_events()) == []
    assert metric(tier, "kvstore_stored_chunks_total", tier="disk") == 2


def test_a_store_of_chunks_already_on_disk_writes_nothing(harness: Harness) -> None:
    tier = harness.open()
    harness.store(tier, 1, 0, 2)
    tier.take_events()
    tier.submit_store(job(2, [key(0), key(1)], [0, 1]))
    result = finish(tier, 2)[2]
    assert result.success and result.transfer_bytes == 0
    assert list(tier.take_events()) == []
    assert metric(tier, "kvstore_transfer_bytes_total", direction="cpu_to_disk") == 2 * SLOT_BYTES


def test_eviction_by_bytes_reports_each_removal_once(harness: Harness) -> None:
    tier = harness.open(capacity_bytes=4 * SLOT_BYTES)
    harness.store(tier, 1, 0, 4)
    tier.touch([key(0)], CTX)  # now key(1) is the least recently used
    harness.store(tier, 2, 4, 2)
    assert lookups(tier, range(6)) == [
        LookupResult.HIT, LookupResult.MISS, LookupResult.MISS, *[LookupResult.HIT] * 3
    ]  # fmt: skip
    stats = tier.store.stats().namespaces[tier.namespace]
    assert (stats.num_entries, stats.used_bytes) == (4, 4 * SLOT_BYTES)
    tier.on_schedule_end(STEP_END)  # the hits above are no longer promised to a promotion
    harness.store(tier, 3, 1, 1)  # key(1) again: stored again, key(3) goes
    stored, removed = split(tier.take_events())
    assert sorted(removed) == sorted([key(1), key(2), key(3)])
    assert stored.count(key(1)) == 2 and removed.count(key(1)) == 1
    assert metric(tier, "kvstore_evicted_chunks_total", tier="disk") == 3
    assert metric(tier, "kvstore_removed_chunks_total", tier="disk", reason="evicted") == 3


def test_a_lookup_hit_is_not_evicted_before_its_load_is_submitted(harness: Harness) -> None:
    tier = harness.open(capacity_bytes=2 * SLOT_BYTES)
    harness.store(tier, 1, 0, 2)
    assert tier.lookup(key(0), CTX) is LookupResult.HIT
    assert tier.lookup(key(1), CTX) is LookupResult.HIT
    tier.submit_store(job(2, [key(5)], [5]))  # no room: both are promised to a promotion
    assert finish(tier, 2)[2].success is False
    assert lookups(tier, range(2)) == [LookupResult.HIT] * 2
    tier.on_schedule_end(STEP_END)
    harness.store(tier, 3, 5, 1)
    assert tier.lookup(key(5), CTX) is LookupResult.HIT


def test_a_chunk_being_loaded_is_not_evicted(harness: Harness) -> None:
    tier = harness.open(capacity_bytes=2 * SLOT_BYTES)
    values = harness.store(tier, 1, 0, 2)
    tier.on_schedule_end(STEP_END)
    tier.submit_load(job(2, [key(0)], [9], is_promotion=True))
    harness.store(tier, 3, 2, 1)  # evicts key(1), not the pinned key(0)
    assert finish(tier, 2)[2].success
    assert harness.primary[9].tobytes() == values[key(0)]
    assert tier.lookup(key(1), CTX) is LookupResult.MISS


def test_a_load_of_a_chunk_no_longer_held_fails_for_that_key_only(harness: Harness) -> None:
    tier = harness.open()
    harness.store(tier, 1, 0, 1)
    tier.submit_load(job(2, [key(0), key(7)], [9, 10], is_promotion=True))
    result = finish(tier, 2)[2]
    assert result.success is False and list(result.successful_keys or ()) == [key(0)]
    assert metric(tier, "kvstore_load_failed_chunks_total") == 1


def test_restart_serves_what_the_previous_engine_stored(harness: Harness) -> None:
    tier = harness.open()
    values = harness.store(tier, 1, 0, 3)
    tier.shutdown()
    harness.primary[:] = 0

    again = harness.open()
    assert lookups(again, range(4)) == [LookupResult.HIT] * 3 + [LookupResult.MISS]
    stored, removed = split(again.take_events())
    assert sorted(stored) == sorted(values) and removed == []
    again.submit_load(job(2, [key(1)], [12], is_promotion=True))
    assert finish(again, 2)[2].success
    assert harness.primary[12].tobytes() == values[key(1)]


def test_restart_with_a_smaller_capacity_keeps_the_most_recently_used(harness: Harness) -> None:
    tier = harness.open()
    harness.store(tier, 1, 0, 4)
    tier.submit_load(job(2, [key(0)], [9], is_promotion=True))  # a hit: key(0) is recent
    finish(tier, 2)
    tier.shutdown()  # records the hit on disk

    again = harness.open(capacity_bytes=2 * SLOT_BYTES)
    hits = [i for i, r in enumerate(lookups(again, range(4))) if r is LookupResult.HIT]
    assert len(hits) == 2 and 0 in hits
    assert again.store.stats().namespaces[again.namespace].num_entries == 2
    meta = again.store.meta(again.namespace, key(0))
    assert meta is not None and meta.num_hits == 1


def test_an_engine_with_another_kv_dtype_never_reads_the_chunks(harness: Harness) -> None:
    from .helpers import tiering_spec

    tier = harness.open()
    harness.store(tier, 1, 0, 2)
    tier.shutdown()
    other = harness.open(spec=tiering_spec(dtype="float16"))
    assert other.namespace != tier.namespace
    assert lookups(other, range(2)) == [LookupResult.MISS] * 2
    assert set(other.store.namespaces()) == {tier.namespace, other.namespace}


def test_events_stay_off_when_vllm_publishes_none(harness: Harness) -> None:
    from .helpers import tiering_spec

    tier = harness.open(spec=tiering_spec(enable_events=False))
    harness.store(tier, 1, 0, 1)
    assert list(tier.take_events()) == []
    quiet = harness.open(path=str(harness.path.parent / "quiet"), enable_kv_events=False)
    harness.store(quiet, 2, 0, 1)
    assert list(quiet.take_events()) == []
    assert metric(quiet, "kvstore_stored_chunks_total", tier="disk") == 1


def test_keys_of_other_groups_are_distinct_chunks(harness: Harness) -> None:
    tier = harness.open()
    harness.primary[0] = 1
    harness.primary[1] = 2
    tier.submit_store(job(1, [key(0, group=0), key(0, group=1)], [0, 1]))
    assert finish(tier, 1)[1].success
    tier.submit_load(job(2, [key(0, group=1)], [5], is_promotion=True))
    assert finish(tier, 2)[2].success
    assert np.all(harness.primary[5] == 2)
