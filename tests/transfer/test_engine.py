"""TransferEngine on the CPU path, with a real PagedKVView over small tensors (no vLLM).

In-step copies: sync loads complete inside `run_loads`; queued loads and stores progress by the
step's byte budget; `flush` finishes named jobs at once; failures come back as results.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
import torch

from kvstore.transfer.audit import LoadAudit
from kvstore.transfer.engine import SliceSpec, StepBudget, TransferEngine
from kvstore.transfer.jobs import ChunkSegment, CopyJob, CopyResult, JobKind
from tiers.paged import ChunkCopy, PagedKVView

NUM_BLOCKS = 16
BLOCKS_PER_CHUNK = 2
LAYER_SHAPE = (NUM_BLOCKS, 2, 4, 8)  # [blocks, heads, block tokens, 2 * head] like vLLM's CPU


class Rows:
    """A CPU region stand-in: one uint8 tensor per row."""

    def __init__(self, num_rows: int, row_bytes: int) -> None:
        self.rows = torch.zeros(num_rows, row_bytes, dtype=torch.uint8)

    def row_tensor(self, index: int) -> torch.Tensor:
        return self.rows[index]


def make(
    budget: StepBudget | None = None, audit: LoadAudit | None = None, copier: Any = None
) -> tuple[TransferEngine, PagedKVView, Rows, list[torch.Tensor]]:
    torch.manual_seed(0)
    layers = [torch.randn(LAYER_SHAPE, dtype=torch.bfloat16) for _ in range(2)]
    view = PagedKVView({f"layer.{i}": t for i, t in enumerate(layers)}, NUM_BLOCKS)
    slice_bytes = view.buffer_bytes(BLOCKS_PER_CHUNK)
    rows = Rows(8, slice_bytes)
    engine = TransferEngine(
        copier or view,
        lambda: rows,
        SliceSpec(0, slice_bytes),
        device=torch.device("cpu"),
        budget=budget,
        audit=audit,
    )
    return engine, view, rows, layers


def job(job_id: int, kind: JobKind, chunks: Sequence[tuple[int, tuple[int, ...]]],
        *, is_sync: bool = False) -> CopyJob:  # fmt: skip
    segments = tuple(ChunkSegment(row, 0, blocks, f"key{row}".encode()) for row, blocks in chunks)
    return CopyJob(job_id, kind, f"req{job_id}", segments, is_sync=is_sync)


def blocks(layers: list[torch.Tensor], ids: Sequence[int]) -> list[torch.Tensor]:
    return [layer[list(ids)].clone() for layer in layers]


def test_store_then_sync_load_round_trips_bytes() -> None:
    engine, _, _, layers = make()
    source = blocks(layers, (0, 1))
    engine.run_stores([job(1, JobKind.STORE, [(3, (0, 1))])])
    (stored,) = engine.poll()
    assert stored.is_ok and stored.num_bytes > 0
    engine.run_loads([job(2, JobKind.LOAD, [(3, (6, 7))], is_sync=True)])
    (loaded,) = engine.poll()  # done before run_loads returned: the forward can read it
    assert loaded.is_ok and loaded.is_sync
    for before, layer in zip(source, layers, strict=True):
        assert torch.equal(layer[[6, 7]].view(torch.uint8), before.view(torch.uint8))


def test_queued_work_progresses_by_the_step_budget() -> None:
    engine, _, _, _ = make(StepBudget(store_bytes=view_bytes(), load_bytes=view_bytes()))
    engine.run_stores([job(1, JobKind.STORE, [(0, (0, 1)), (1, (2, 3)), (2, (4, 5))])])
    assert engine.poll() == [] and engine.num_pending == 1  # one chunk per step
    engine.run_stores([])
    assert engine.poll() == []
    engine.run_stores([])  # an empty step still copies what is queued
    (result,) = engine.poll()
    assert result.job_id == 1 and result.is_ok and engine.num_pending == 0
    engine.run_loads([job(2, JobKind.LOAD, [(0, (8, 9)), (1, (10, 11))])])
    assert engine.poll() == []
    engine.run_loads([job(3, JobKind.LOAD, [(2, (12, 13))], is_sync=True)])
    results = {r.job_id: r for r in engine.poll()}
    assert set(results) == {2, 3}  # the sync load ran in full, the queued one finished too
    assert not results[2].is_sync and results[3].is_sync


def view_bytes() -> int:
    return make()[1].buffer_bytes(BLOCKS_PER_CHUNK)


def test_flush_finishes_named_jobs_now() -> None:
    engine, _, _, _ = make(StepBudget(store_bytes=1))
    engine.run_stores([job(1, JobKind.STORE, [(0, (0, 1)), (1, (2, 3))]),
                       job(2, JobKind.STORE, [(2, (4, 5))])])  # fmt: skip
    assert engine.poll() == []
    engine.flush([2])
    assert [r.job_id for r in engine.poll()] == [2]
    assert engine.num_pending == 1


def test_missing_rows_and_failing_copies_come_back_as_failed_blocks() -> None:
    engine, _, _, _ = make()
    engine.run_loads([job(1, JobKind.LOAD, [(0, (0, 1)), (-1, (2, 3))], is_sync=True)])
    (result,) = engine.poll()
    assert not result.is_ok and result.failed_block_ids == (2, 3)

    class Broken:
        def gather_many(self, items: Sequence[ChunkCopy], *, stream: Any = None) -> int:
            raise RuntimeError("boom")

        def scatter_many(self, items: Sequence[ChunkCopy], *, stream: Any = None) -> int:
            raise RuntimeError("boom")

    broken, _, _, _ = make(copier=Broken())
    broken.run_loads([job(2, JobKind.LOAD, [(0, (4, 5))], is_sync=True)])
    broken.run_stores([job(3, JobKind.STORE, [(1, (6, 7))])])
    results: dict[int, CopyResult] = {r.job_id: r for r in broken.poll()}
    assert results[2].failed_block_ids == (4, 5) and "boom" in (results[2].error or "")
    assert not results[3].is_ok and results[3].failed_block_ids == ()


def test_audit_verifies_loads_and_catches_a_damaged_row() -> None:
    audit = LoadAudit()
    engine, _, rows, _ = make(audit=audit)
    engine.run_stores([job(1, JobKind.STORE, [(0, (0, 1)), (1, (2, 3))])])
    engine.poll()
    rows.rows[1, 5] ^= 0xFF  # damage row 1 after its digest was taken
    engine.run_loads([job(2, JobKind.LOAD, [(0, (8, 9)), (1, (10, 11))], is_sync=True)])
    (result,) = engine.poll()
    counts = audit.take_counts()
    assert (counts.verified, counts.mismatched, counts.unknown) == (1, 1, 0)
    assert not result.is_ok and result.failed_block_ids == (10, 11)
    engine.run_loads([job(3, JobKind.LOAD, [(5, (12, 13))], is_sync=True)])  # never stored here
    engine.poll()
    assert audit.take_counts().unknown == 1


def test_close_drops_queued_jobs_and_refuses_more() -> None:
    engine, _, _, _ = make(StepBudget(store_bytes=1))
    engine.run_stores([job(1, JobKind.STORE, [(0, (0, 1)), (1, (2, 3))])])
    engine.close()
    assert engine.num_pending == 0
    with pytest.raises(RuntimeError, match="closed"):
        engine.run_stores([])
