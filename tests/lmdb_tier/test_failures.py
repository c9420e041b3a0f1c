"""LMDBTier under failure: corrupt values, a full or failing disk, chunks deleted behind its back,
bad jobs. Failures are job results, never exceptions into vLLM."""

from __future__ import annotations

from typing import Any

import pytest
from vllm.v1.kv_offload.base import LookupResult, ReqContext

from tiers.errors import StoreIOError
from tiers.lmdb import LMDBStore

from .helpers import SLOT_BYTES, Harness, finish, flip_stored_byte, job, key, metric
from .helpers import stored_and_removed as split

CTX = ReqContext(req_id="lookup")
SENTINEL = 0xA5


def test_a_flipped_byte_fails_the_load_of_that_key_only(harness: Harness) -> None:
    tier = harness.open()
    values = harness.store(tier, 1, 0, 3)
    tier.shutdown()
    flip_stored_byte(harness.path, key(1))

    again = harness.open()
    again.take_events()
    harness.primary[8:11] = SENTINEL
    again.submit_load(job(2, [key(0), key(1), key(2)], [8, 9, 10], is_promotion=True))
    result = finish(again, 2)[2]
    assert result.success is False
    assert sorted(result.successful_keys or ()) == sorted([key(0), key(2)])
    # vLLM 0.34 may free the failed key's slot at once: the read that wrote it has finished
    assert getattr(result, "deferred_release", None) is None
    assert harness.primary[8].tobytes() == values[key(0)]
    assert harness.primary[10].tobytes() == values[key(2)]
    # slot 9 holds the bad bytes, read straight into it: vLLM frees it unused (not loaded)
    assert metric(again, "kvstore_checksum_failures_total", tier="disk") == 1
    assert metric(again, "kvstore_removed_chunks_total", tier="disk", reason="corrupt") == 1
    assert again.lookup(key(1), CTX) is LookupResult.MISS
    assert split(again.take_events()) == ([], [key(1)])
    again.drain_jobs()
    assert not again.store.contains(again.namespace, key(1))  # deleted
    assert again.store.contains(again.namespace, key(0))


def test_a_store_that_the_disk_cannot_take_fails_without_raising(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    tier = harness.open()

    def disk_full(*args: Any, **kwargs: Any) -> int:  # what `tiers` makes of lmdb.DiskError
        raise StoreIOError("mdb_txn_commit: No space left on device")

    monkeypatch.setattr(tier.store, "put_many", disk_full)
    harness.primary[0:2] = 7
    tier.submit_store(job(1, [key(0), key(1)], [0, 1]))
    assert finish(tier, 1)[1].success is False
    assert not tier.has_pending_work()
    assert [tier.lookup(key(i), CTX) for i in range(2)] == [LookupResult.MISS] * 2
    assert list(tier.take_events()) == []
    assert metric(tier, "kvstore_io_errors_total", op="write") == 1
    assert metric(tier, "kvstore_transfers_total", direction="cpu_to_disk", result="error") == 1

    monkeypatch.undo()  # the disk recovers: the next store works
    harness.store(tier, 2, 0, 2)
    assert tier.lookup(key(0), CTX) is LookupResult.HIT


def test_a_store_filled_by_another_writer_refuses_the_write(harness: Harness) -> None:
    capacity = 8 * SLOT_BYTES
    tier = harness.open(capacity_bytes=capacity)
    with LMDBStore.open(harness.path, capacity_bytes=capacity) as other:  # e.g. `kvstore` tools
        other.register_namespace("someone-else", {})
        other.put_many("someone-else", [(b"big", bytes(capacity - SLOT_BYTES))])
    harness.primary[0:2] = 3
    tier.submit_store(job(1, [key(0), key(1)], [0, 1]))  # StoreFullError in the writer
    assert finish(tier, 1)[1].success is False
    assert tier.lookup(key(0), CTX) is LookupResult.MISS


def test_a_read_error_fails_the_key_and_keeps_the_chunk(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    tier = harness.open()
    harness.store(tier, 1, 0, 1)

    def failing_read(*args: Any, **kwargs: Any) -> int:
        raise StoreIOError("mdb_get: Input/output error")

    monkeypatch.setattr(tier.store, "get_many_into", failing_read)
    tier.submit_load(job(2, [key(0)], [9], is_promotion=True))
    result = finish(tier, 2)[2]
    assert result.success is False and result.successful_keys is None
    assert metric(tier, "kvstore_io_errors_total", op="read") == 1
    assert tier.lookup(key(0), CTX) is LookupResult.HIT  # maybe transient: not dropped


def test_a_chunk_deleted_behind_the_tier_is_a_miss(harness: Harness) -> None:
    tier = harness.open()
    harness.store(tier, 1, 0, 2)
    tier.take_events()
    with LMDBStore.open(harness.path, capacity_bytes=64 * SLOT_BYTES) as other:  # `kvstore rm`
        assert other.delete_many(tier.namespace, [key(0)]) == 1
    tier.submit_load(job(2, [key(0), key(1)], [8, 9], is_promotion=True))
    result = finish(tier, 2)[2]
    assert result.success is False and list(result.successful_keys or ()) == [key(1)]
    assert split(tier.take_events()) == ([], [key(0)])
    assert metric(tier, "kvstore_removed_chunks_total", tier="disk", reason="deleted") == 1
    assert tier.lookup(key(0), CTX) is LookupResult.MISS


def test_jobs_with_bad_chunk_ids_fail_without_raising(harness: Harness) -> None:
    tier = harness.open()
    tier.submit_store(job(1, [key(0)], [99]))
    tier.submit_store(job(2, [key(0), key(1)], [0]))
    tier.submit_load(job(3, [key(0)], [-1], is_promotion=True))
    results = finish(tier, 1, 2, 3)
    assert [results[i].success for i in (1, 2, 3)] == [False] * 3
    assert not tier.has_pending_work()


def test_work_submitted_after_shutdown_fails_without_raising(harness: Harness) -> None:
    tier = harness.open()
    tier.shutdown()
    tier.shutdown()  # idempotent
    harness.primary[0] = 1
    tier.submit_store(job(1, [key(0)], [0]))
    assert finish(tier, 1)[1].success is False


def overwrite(harness: Harness, namespace: str, chunk_key: bytes, size_bytes: int) -> None:
    """Another process (e.g. a buggy tool) writes a value of `size_bytes` under `chunk_key`."""
    with LMDBStore.open(harness.path, capacity_bytes=64 * SLOT_BYTES) as other:
        other.put_many(namespace, [(chunk_key, bytes(size_bytes))])


def test_a_value_of_the_wrong_size_is_deleted_at_start(harness: Harness) -> None:
    tier = harness.open()
    harness.store(tier, 1, 0, 3)
    namespace = tier.namespace
    tier.shutdown()
    overwrite(harness, namespace, key(1), SLOT_BYTES - 1)
    overwrite(harness, namespace, key(2), SLOT_BYTES + 1)

    again = harness.open()
    assert [again.lookup(key(i), CTX) for i in range(3)] == [
        LookupResult.HIT, LookupResult.MISS, LookupResult.MISS
    ]  # fmt: skip
    assert set(again.store.iter_keys(namespace)) == {key(0)}


def test_a_short_value_found_by_a_load_is_one_corrupt_key(harness: Harness) -> None:
    tier = harness.open()
    values = harness.store(tier, 1, 0, 2)
    tier.take_events()
    overwrite(harness, tier.namespace, key(1), SLOT_BYTES - 1)  # checksummed, but not a slot
    tier.submit_load(job(2, [key(0), key(1)], [8, 9], is_promotion=True))
    result = finish(tier, 2)[2]
    assert result.success is False and list(result.successful_keys or ()) == [key(0)]
    assert harness.primary[8].tobytes() == values[key(0)]
    assert split(tier.take_events()) == ([], [key(1)])
    assert metric(tier, "kvstore_checksum_failures_total", tier="disk") == 1
    assert metric(tier, "kvstore_removed_chunks_total", tier="disk", reason="corrupt") == 1
    tier.drain_jobs()
    assert not tier.store.contains(tier.namespace, key(1))


def test_a_long_value_found_by_a_load_is_one_corrupt_key(harness: Harness) -> None:
    tier = harness.open()
    harness.store(tier, 1, 0, 2)
    overwrite(harness, tier.namespace, key(1), SLOT_BYTES + 1)
    tier.submit_load(job(2, [key(0), key(1)], [8, 9], is_promotion=True))
    result = finish(tier, 2)[2]
    assert list(result.successful_keys or ()) == [key(0)]
    assert metric(tier, "kvstore_io_errors_total", op="read") == 0
    assert tier.lookup(key(1), CTX) is LookupResult.MISS
