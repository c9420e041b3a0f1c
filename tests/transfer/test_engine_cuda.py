"""TransferEngine's CUDA path: copies on a side stream ordered by events, completion polled,
a sync load ordered before the compute stream reads it, the audit (skipped without CUDA)."""

from __future__ import annotations

import time

import pytest
import torch

from kvstore.transfer.audit import LoadAudit
from kvstore.transfer.engine import SliceSpec, TransferEngine
from kvstore.transfer.jobs import ChunkSegment, CopyJob, CopyResult, JobKind
from tiers.paged import PagedKVView

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

NUM_BLOCKS = 16
SHAPE = (2, NUM_BLOCKS, 4, 2, 16)  # vLLM's CUDA layout: [K/V, blocks, block tokens, heads, dim]


class PinnedRows:
    def __init__(self, num_rows: int, row_bytes: int) -> None:
        self.rows = torch.zeros(num_rows, row_bytes, dtype=torch.uint8).pin_memory()

    def row_tensor(self, index: int) -> torch.Tensor:
        return self.rows[index]


def job(job_id: int, kind: JobKind, row: int, blocks: tuple[int, ...], *, is_sync: bool = False
        ) -> CopyJob:  # fmt: skip
    return CopyJob(job_id, kind, "r", (ChunkSegment(row, 0, blocks, bytes([row]) * 32),), is_sync)


def wait_results(engine: TransferEngine, n: int) -> list[CopyResult]:
    results: list[CopyResult] = []
    deadline = time.monotonic() + 10
    while len(results) < n:
        assert time.monotonic() < deadline
        results += engine.poll()
    return results


def test_store_and_load_on_a_side_stream_round_trip_with_the_audit() -> None:
    torch.manual_seed(0)
    layers = {f"l{i}": torch.randn(SHAPE, dtype=torch.bfloat16, device="cuda") for i in range(2)}
    view = PagedKVView(layers, NUM_BLOCKS)
    size = view.buffer_bytes(2)
    rows = PinnedRows(4, size)
    audit = LoadAudit()
    engine = TransferEngine(
        view, lambda: rows, SliceSpec(0, size), device=torch.device("cuda"), audit=audit
    )
    expected = [t[:, [0, 1]].clone() for t in layers.values()]
    engine.run_stores([job(1, JobKind.STORE, 2, (0, 1))])
    (stored,) = wait_results(engine, 1)
    assert stored.is_ok and stored.num_bytes == size
    engine.run_loads([job(2, JobKind.LOAD, 2, (9, 10), is_sync=True)])
    # the compute stream waits for the copy: reading the blocks now sees the loaded bytes
    for tensor, before in zip(layers.values(), expected, strict=True):
        assert torch.equal(tensor[:, [9, 10]], before)
    (loaded,) = wait_results(engine, 1)
    assert loaded.is_ok and loaded.is_sync
    assert audit.take_counts().verified == 1
    engine.close()
