"""What LMDBTier's job results tell vLLM: only real writes count for backpressure, and writes
the tier service merged into one transaction still end each vLLM job with its own result."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest
from vllm.v1.kv_offload.base import ReqContext
from vllm.v1.kv_offload.tiering.backpressure import BackpressureDetector
from vllm.v1.kv_offload.tiering.base import JobResult, TransferJob

from kvstore.vllm import LMDBTier
from tiers.errors import StoreIOError

from .helpers import NUM_SLOTS, SLOT_BYTES, Harness, fill, finish, job, key, metric

CTX = ReqContext(req_id="lookup")


class RecordingDetector(BackpressureDetector):
    """Records the store completions vLLM feeds it; never signals pressure."""

    def __init__(self) -> None:
        super().__init__()
        self.num_bytes: list[int] = []

    def on_store_completed(self, elapsed_s: float, num_bytes: int) -> None:
        self.num_bytes.append(num_bytes)

    def is_under_pressure(self) -> bool:
        return False

    def reset(self) -> None:
        self.num_bytes.clear()


def feed(detector: BackpressureDetector, transfer: TransferJob, result: JobResult) -> None:
    """What `TieringOffloadingManager._update_backpressure` does with a finished store job."""
    if result.success:
        num_bytes = result.transfer_bytes
        if num_bytes is None:
            num_bytes = len(transfer.keys) * SLOT_BYTES
        detector.update(transfer.submit_time, num_bytes)


def run_store(tier: LMDBTier, transfer: TransferJob) -> JobResult:
    tier.submit_store(transfer)
    return finish(tier, transfer.job_id)[transfer.job_id]


class Gate:
    """Holds every call of a store method until `open()`; counts the calls."""

    def __init__(self) -> None:
        self.event = threading.Event()
        self.entered = threading.Event()
        self.num_calls = 0

    def wrap(self, method: Callable[..., Any]) -> Callable[..., Any]:
        def gated(*args: Any, **kwargs: Any) -> Any:
            self.num_calls += 1
            self.entered.set()
            assert self.event.wait(30), "the gate was never opened"
            return method(*args, **kwargs)

        return gated


def test_only_real_writes_report_bytes_to_the_backpressure_detector(harness: Harness) -> None:
    tier = harness.open(capacity_bytes=2 * SLOT_BYTES)
    detector = RecordingDetector()
    for slot in range(3):
        fill(harness.primary, slot, seed=slot)

    written = job(1, [key(0), key(1)], [0, 1])
    result = run_store(tier, written)
    assert result.success and result.transfer_bytes == 2 * SLOT_BYTES
    assert result.transfer_time is not None and result.transfer_time > 0
    feed(detector, written, result)

    no_io = [
        job(2, [key(0), key(1)], [0, 1]),  # already on disk: success, nothing written
        job(3, [key(2)], [2]),  # no room: both chunks are promised to a load
        job(4, [key(2)], [NUM_SLOTS]),  # bad chunk id
    ]
    assert tier.lookup(key(0), CTX).name == tier.lookup(key(1), CTX).name == "HIT"
    results = [run_store(tier, transfer) for transfer in no_io]
    assert [r.success for r in results] == [True, False, False]
    assert [r.transfer_bytes for r in results] == [0, 0, 0]
    assert [r.transfer_time for r in results] == [None, None, None]
    for transfer, result in zip(no_io, results, strict=True):
        feed(detector, transfer, result)
    assert detector.num_bytes == [2 * SLOT_BYTES]


def test_a_store_dropped_by_the_full_write_queue_reports_no_bytes(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    tier = harness.open()
    gate = Gate()
    monkeypatch.setattr(tier.store, "put_many", gate.wrap(tier.store.put_many))
    try:
        tier.submit_store(job(1, [key(i) for i in range(NUM_SLOTS)], range(NUM_SLOTS)))
        assert gate.entered.wait(5)  # the queue holds a write per primary slot: it is full
        dropped = run_store(tier, job(2, [key(NUM_SLOTS)], [0]))
        assert (dropped.success, dropped.transfer_bytes) == (False, 0)
        assert (
            metric(tier, "kvstore_queue_dropped_total", queue="write_through", reason="queue_full")
            == 1
        )
    finally:
        gate.event.set()
    first = finish(tier, 1)[1]
    assert first.success and first.transfer_bytes == NUM_SLOTS * SLOT_BYTES


def test_a_failed_write_reports_no_bytes(harness: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    tier = harness.open()

    def failing_put(*args: Any, **kwargs: Any) -> int:
        raise StoreIOError("mdb_txn_commit: Input/output error")

    monkeypatch.setattr(tier.store, "put_many", failing_put)
    result = run_store(tier, job(1, [key(0)], [0]))
    assert (result.success, result.transfer_bytes) == (False, 0)


def test_merged_writes_end_each_job_with_its_own_result(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    tier = harness.open()
    gate = Gate()
    monkeypatch.setattr(tier.store, "put_many", gate.wrap(tier.store.put_many))
    values = {key(i): fill(harness.primary, i, seed=i) for i in range(4)}
    tier.submit_store(job(1, [key(0)], [0]))
    assert gate.entered.wait(5)  # job 1 is being written; jobs 2 and 3 queue behind it
    tier.submit_store(job(2, [key(1), key(2)], [1, 2]))
    tier.submit_store(job(3, [key(3), key(0)], [3, 0]))  # key(0) is being stored by job 1
    gate.event.set()
    results = finish(tier, 1, 2, 3)
    assert gate.num_calls == 2  # jobs 2 and 3 in one transaction
    assert all(result.success for result in results.values())
    assert [results[i].transfer_bytes for i in (1, 2, 3)] == [n * SLOT_BYTES for n in (1, 2, 1)]
    harness.primary[:] = 0
    tier.submit_load(job(4, list(values), [8, 9, 10, 11], is_promotion=True))
    assert finish(tier, 4)[4].success
    assert [harness.primary[s].tobytes() for s in (8, 9, 10, 11)] == list(values.values())
