"""The worker's transfer engine: copies whole chunks between engine KV blocks and CPU rows.

Never on the step's critical path: on the CPU platform jobs run on one background thread (the
copies release the GIL); on CUDA they run on a side stream ordered after the compute stream,
and completion is polled through CUDA events. Workers decide nothing: they execute the jobs the
scheduler sent and report results, failures included, so vLLM can recompute.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from kvstore.transfer.jobs import JobKind, JobResult, TransferJob
from tiers.paged import ChunkCopy

__all__ = ["ChunkCopier", "RowSource", "TransferEngine"]

logger = logging.getLogger(__name__)


class RowSource(Protocol):
    """The CPU region as the engine sees it: a uint8 tensor per row."""

    def row_tensor(self, index: int) -> torch.Tensor: ...


class ChunkCopier(Protocol):
    """The paged KV view: batched gathers/scatters of engine blocks into/out of chunk buffers
    (one call per job: see `tiers.paged.PagedKVView.gather_many`)."""

    def gather_many(self, items: Sequence[ChunkCopy], *, stream: Any = None) -> int: ...

    def scatter_many(self, items: Sequence[ChunkCopy], *, stream: Any = None) -> int: ...


@dataclass(frozen=True, slots=True)
class SliceSpec:
    """Where this rank's slice lives inside a row."""

    offset_bytes: int
    size_bytes: int


class TransferEngine:
    """Executes transfer jobs asynchronously and reports their results through `poll()`.

    Threading: `submit`, `poll`, `wait` and `close` are called from the worker's model-runner
    thread only; the copies run on one private thread (or a CUDA stream).
    """

    def __init__(
        self,
        copier: ChunkCopier,
        rows: Callable[[], RowSource],
        slice_spec: SliceSpec,
        *,
        device: torch.device,
    ) -> None:
        self._copier = copier
        self._rows_factory = rows
        self._rows: RowSource | None = None
        self._slice = slice_spec
        self._is_cuda = device.type == "cuda"
        self._stream: Any = torch.cuda.Stream(device=device) if self._is_cuda else None  # type: ignore[no-untyped-call]
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kvstore-xfer")
        self._pending: dict[int, Future[JobResult]] = {}
        self._lock = threading.Lock()
        self._is_closed = False

    # -- public API -------------------------------------------------------------------------

    def submit(self, job: TransferJob) -> None:
        """Start `job`; its result comes back from a later `poll()`."""
        if self._is_closed:
            raise RuntimeError("TransferEngine is closed")
        ready_event = None
        if self._is_cuda:
            # Stores must read what this step's forward wrote; loads must not race the
            # compute stream's use of the destination blocks.
            ready_event = torch.cuda.Event()  # type: ignore[no-untyped-call]
            ready_event.record(torch.cuda.current_stream())
        self._pending[job.job_id] = self._executor.submit(self._run, job, ready_event)

    def poll(self) -> list[JobResult]:
        """Results of the jobs finished since the last poll."""
        done = [job_id for job_id, fut in self._pending.items() if fut.done()]
        return [self._pending.pop(job_id).result() for job_id in done]

    def wait(self, job_ids: Iterable[int], timeout_s: float | None = None) -> None:
        """Block until the given jobs finished (used before their blocks are reused)."""
        futures = [self._pending[j] for j in job_ids if j in self._pending]
        if futures:
            wait_futures(futures, timeout=timeout_s)

    @property
    def num_pending(self) -> int:
        return len(self._pending)

    def close(self, timeout_s: float = 10.0) -> None:
        """Finish in-flight jobs (bounded) and stop the copy thread."""
        if self._is_closed:
            return
        self._is_closed = True
        self.wait(list(self._pending), timeout_s=timeout_s)
        self._executor.shutdown(wait=False, cancel_futures=True)

    # -- the copy thread --------------------------------------------------------------------

    def _row_slice(self, row: int) -> torch.Tensor:
        if self._rows is None:
            self._rows = self._rows_factory()  # attach lazily: the scheduler creates the region
        full = self._rows.row_tensor(row)
        return full[self._slice.offset_bytes : self._slice.offset_bytes + self._slice.size_bytes]

    def _run(self, job: TransferJob, ready_event: Any) -> JobResult:
        start_s = time.perf_counter()
        num_bytes = 0
        failed = [b for seg in job.segments if seg.row < 0 for b in seg.block_ids]
        error: str | None = None
        try:
            if ready_event is not None:
                self._stream.wait_event(ready_event)
            items = [
                ChunkCopy(seg.block_ids, self._row_slice(seg.row), seg.first_block)
                for seg in job.segments
                if seg.row >= 0
            ]
            if items and job.kind is JobKind.STORE:
                num_bytes = self._copier.gather_many(items, stream=self._stream)
            elif items:
                num_bytes = self._copier.scatter_many(items, stream=self._stream)
            if self._is_cuda:
                done = torch.cuda.Event()  # type: ignore[no-untyped-call]
                done.record(self._stream)
                done.synchronize()
        except Exception as exc:  # a failed copy must reach vLLM as a failure, not a crash
            logger.warning("kvstore transfer job %d (%s) failed: %s", job.job_id, job.kind, exc)
            error = f"{type(exc).__name__}: {exc}"
            failed = job.block_ids if job.kind is JobKind.LOAD else []
        return JobResult(
            job_id=job.job_id,
            kind=job.kind,
            req_id=job.req_id,
            is_ok=error is None and not failed,
            num_bytes=num_bytes,
            duration_s=time.perf_counter() - start_s,
            failed_block_ids=tuple(failed),
            error=error,
        )
