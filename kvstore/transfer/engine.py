"""The worker's transfer engine: copies whole chunks between engine KV blocks and CPU rows.

**CPU platform: in-step copies.** Jobs run on the caller's thread (vLLM's model-runner thread,
inside the forward's connector hooks), so torch's copies use the engine's own OpenMP team. A
background copy thread would bring a second OpenMP team into the process, which fights the
engine's spinning threads for the cores and made loads 100x slower than a memcpy. Loads the
step's forward reads (`is_sync`) run in full before the forward; other loads and all stores
run in order, up to a byte budget per step, so one step never stalls for long. A job that is
not done when the budget is spent continues at the next step (vLLM keeps stepping while kvstore
reports pending work, and keeps the blocks of stores in flight alive).

**CUDA: a side stream.** Jobs are enqueued on a side stream ordered after the compute stream
(stores read what this step's forward wrote; loads wait for the blocks to be free) and finish
asynchronously; completion is an event, polled. A sync load makes the compute stream wait for
its copies' event, so the forward reads the loaded blocks without the host ever blocking.

Workers decide nothing: they execute the jobs the scheduler sent and report results, failures
included, so vLLM recomputes.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from kvstore.transfer.audit import AuditResult, LoadAudit
from kvstore.transfer.jobs import ChunkSegment, CopyJob, CopyResult, JobKind
from tiers.paged import ChunkCopy

__all__ = ["ChunkCopier", "RowSource", "SliceSpec", "StepBudget", "TransferEngine"]

logger = logging.getLogger(__name__)


class RowSource(Protocol):
    """The CPU region as the engine sees it: a uint8 tensor per row."""

    def row_tensor(self, index: int) -> torch.Tensor: ...


class ChunkCopier(Protocol):
    """The paged KV view: batched gathers/scatters of engine blocks into/out of chunk buffers
    (one call per batch: see `tiers.paged.PagedKVView.gather_many`)."""

    def gather_many(self, items: Sequence[ChunkCopy], *, stream: Any = None) -> int: ...

    def scatter_many(self, items: Sequence[ChunkCopy], *, stream: Any = None) -> int: ...


@dataclass(frozen=True, slots=True)
class SliceSpec:
    """Where this rank's slice lives inside a row."""

    offset_bytes: int
    size_bytes: int


@dataclass(frozen=True, slots=True)
class StepBudget:
    """Bytes per step the CPU path copies for queued loads and for stores (0 = no limit).
    Sync loads always run in full: the step's forward needs them."""

    load_bytes: int = 0
    store_bytes: int = 0


@dataclass(frozen=True, slots=True)
class _Item:
    """A chunk copy and the KV cache group whose layers it reads or writes."""

    group: int
    copy: ChunkCopy


@dataclass(slots=True)
class _Progress:
    """A job under way: segments `[0, next_segment)` are done."""

    job: CopyJob
    next_segment: int = 0
    num_bytes: int = 0
    duration_s: float = 0.0
    failed: list[int] = field(default_factory=list)
    error: str | None = None

    @property
    def is_done(self) -> bool:
        return self.error is not None or self.next_segment >= len(self.job.segments)


class TransferEngine:
    """Executes copy jobs and reports their results through `poll()` (module docstring).

    Threading: every method is called from the worker's model-runner thread only.
    """

    def __init__(
        self,
        copier: ChunkCopier | Sequence[ChunkCopier],
        rows: Callable[[], RowSource],
        slice_spec: SliceSpec,
        *,
        device: torch.device,
        budget: StepBudget | None = None,
        audit: LoadAudit | None = None,
    ) -> None:
        # one copier per KV cache group (a segment's `group` picks it)
        self._copiers: tuple[ChunkCopier, ...] = (
            tuple(copier) if isinstance(copier, Sequence) else (copier,)
        )
        self._rows_factory = rows
        self._rows: RowSource | None = None
        self._slice = slice_spec
        self._budget = budget or StepBudget()
        self._audit = audit
        self._is_cuda = device.type == "cuda"
        self._stream: Any = torch.cuda.Stream(device=device) if self._is_cuda else None  # type: ignore[no-untyped-call]
        self._loads: deque[_Progress] = deque()
        self._stores: deque[_Progress] = deque()
        self._in_flight: dict[int, tuple[_Progress, Any, float]] = {}  # CUDA: job -> done event
        self._done: list[CopyResult] = []
        self._is_closed = False

    # -- public API -------------------------------------------------------------------------

    def run_loads(self, jobs: Iterable[CopyJob]) -> None:
        """Start this step's loads: sync ones complete before this returns (CPU) or before
        the compute stream reads their blocks (CUDA); queued ones continue within budget."""
        self._check_open()
        for job in jobs:
            progress = _Progress(job)
            if self._is_cuda:
                self._enqueue_cuda(progress)
            elif job.is_sync:
                self._run_segments(progress, len(job.segments))
                self._finish(progress)
            else:
                self._loads.append(progress)
        self._drain(self._loads, self._budget.load_bytes)

    def run_stores(self, jobs: Iterable[CopyJob]) -> None:
        """Queue this step's stores and copy what the step's budget allows."""
        self._check_open()
        for job in jobs:
            progress = _Progress(job)
            if self._is_cuda:
                self._enqueue_cuda(progress)
            elif job.is_urgent:  # its blocks may be reused from the next step on
                self._run_segments(progress, len(job.segments))
                self._finish(progress)
            else:
                self._stores.append(progress)
        self._drain(self._stores, self._budget.store_bytes)

    def flush(self, job_ids: Iterable[int]) -> None:
        """Finish the given jobs now (their blocks are about to be reused: preemption)."""
        wanted = set(job_ids)
        for queue in (self._loads, self._stores):
            for progress in [p for p in queue if p.job.job_id in wanted]:
                queue.remove(progress)
                self._run_segments(progress, len(progress.job.segments))
                self._finish(progress)
        for job_id in wanted & set(self._in_flight):
            self._in_flight[job_id][1].synchronize()
        self._poll_cuda()

    def poll(self) -> list[CopyResult]:
        """Results of the jobs finished since the last poll."""
        self._poll_cuda()
        done, self._done = self._done, []
        return done

    @property
    def num_pending(self) -> int:
        return len(self._loads) + len(self._stores) + len(self._in_flight)

    def close(self) -> None:
        """Drop queued work (vLLM is shutting down) and wait for copies on the side stream."""
        if self._is_closed:
            return
        self._is_closed = True
        if self._loads or self._stores:
            logger.info(
                "kvstore: %d queued copy job(s) dropped at shutdown",
                len(self._loads) + len(self._stores),
            )
        self._loads.clear()
        self._stores.clear()
        for _, event, _ in self._in_flight.values():
            event.synchronize()
        self._in_flight.clear()

    # -- CPU: in-step copies ----------------------------------------------------------------

    def _drain(self, queue: deque[_Progress], budget_bytes: int) -> None:
        """Copy queued jobs in order until `budget_bytes` are spent (at least one segment)."""
        num_segments = (
            max(1, budget_bytes // max(1, self._slice.size_bytes)) if budget_bytes > 0 else -1
        )
        while queue and num_segments != 0:
            progress = queue[0]
            left = len(progress.job.segments) - progress.next_segment
            take = left if num_segments < 0 else min(left, num_segments)
            self._run_segments(progress, take)
            if num_segments > 0:
                num_segments -= take
            if progress.is_done:
                queue.popleft()
                self._finish(progress)

    def _run_segments(self, progress: _Progress, count: int) -> None:
        job = progress.job
        segments = job.segments[progress.next_segment : progress.next_segment + count]
        progress.next_segment += count
        start_s = time.perf_counter()
        try:
            items = self._items(segments, progress)
            if items:
                progress.num_bytes += self._copy(job.kind, items)
            self._audit_segments(job.kind, segments, items, progress)
        except Exception as exc:  # a failed copy reaches vLLM as a failure, never a crash
            self._fail(progress, exc)
        progress.duration_s += time.perf_counter() - start_s

    def _items(self, segments: Sequence[ChunkSegment], progress: _Progress) -> list[_Item]:
        items = []
        for segment in segments:
            if segment.row < 0:  # the scheduler could not provide this chunk
                progress.failed.extend(segment.block_ids)
                continue
            copy = ChunkCopy(segment.block_ids, self._row_slice(segment.row), segment.first_block)
            items.append(_Item(segment.group, copy))
        return items

    def _copy(self, kind: JobKind, items: Sequence[_Item], stream: Any = None) -> int:
        num_bytes = 0
        for group, copier in enumerate(self._copiers):
            copies = [item.copy for item in items if item.group == group]
            if not copies:
                continue
            if kind is JobKind.STORE:
                num_bytes += copier.gather_many(copies, stream=stream)
            else:
                num_bytes += copier.scatter_many(copies, stream=stream)
        return num_bytes

    def _audit_segments(
        self,
        kind: JobKind,
        segments: Sequence[ChunkSegment],
        items: Sequence[_Item],
        progress: _Progress,
    ) -> None:
        audit = self._audit
        if audit is None:
            return
        copied = [s for s in segments if s.row >= 0]
        for segment, item in zip(copied, items, strict=True):
            copy = item.copy
            if kind is JobKind.STORE:
                audit.record_store(segment.key, copy.buffer)
                continue

            def regather(scratch: torch.Tensor, copy: ChunkCopy = copy, group: int = item.group
                         ) -> None:  # fmt: skip
                self._copiers[group].gather_many(
                    [ChunkCopy(copy.block_ids, scratch, copy.first_block)]
                )
                if self._is_cuda:
                    torch.cuda.current_stream().synchronize()  # type: ignore[no-untyped-call]

            if audit.check_load(segment.key, copy.buffer, regather) is AuditResult.MISMATCHED:
                progress.failed.extend(segment.block_ids)

    def _fail(self, progress: _Progress, exc: Exception) -> None:
        job = progress.job
        logger.warning("kvstore copy job %d (%s) failed: %s", job.job_id, job.kind, exc)
        progress.error = f"{type(exc).__name__}: {exc}"
        if job.kind is JobKind.LOAD:
            progress.failed = job.block_ids

    def _finish(self, progress: _Progress) -> None:
        job = progress.job
        self._done.append(
            CopyResult(
                job_id=job.job_id,
                kind=job.kind,
                req_id=job.req_id,
                is_ok=progress.error is None and not progress.failed,
                num_bytes=progress.num_bytes,
                duration_s=progress.duration_s,
                failed_block_ids=tuple(progress.failed) if job.kind is JobKind.LOAD else (),
                error=progress.error,
                is_sync=job.is_sync,
            )
        )

    def _row_slice(self, row: int) -> torch.Tensor:
        if self._rows is None:
            self._rows = self._rows_factory()  # attach lazily: the scheduler creates the region
        full = self._rows.row_tensor(row)
        return full[self._slice.offset_bytes : self._slice.offset_bytes + self._slice.size_bytes]

    def _check_open(self) -> None:
        if self._is_closed:
            raise RuntimeError("TransferEngine is closed")

    # -- CUDA: a side stream ----------------------------------------------------------------

    def _enqueue_cuda(self, progress: _Progress) -> None:
        job = progress.job
        start_s = time.perf_counter()
        try:
            # Stores must read what this step's forward wrote; loads must not race the compute
            # stream's use of the destination blocks.
            self._stream.wait_stream(torch.cuda.current_stream())
            items = self._items(job.segments, progress)
            progress.next_segment = len(job.segments)
            if items:
                progress.num_bytes = self._copy(job.kind, items, stream=self._stream)
            done = torch.cuda.Event()  # type: ignore[no-untyped-call]
            done.record(self._stream)
            # the compute stream waits: this step's forward reads a sync load's blocks, and the
            # next one may rewrite an urgent store's
            if job.is_sync or job.is_urgent:
                torch.cuda.current_stream().wait_event(done)
        except Exception as exc:
            self._fail(progress, exc)
            progress.duration_s = time.perf_counter() - start_s
            self._finish(progress)
            return
        self._in_flight[job.job_id] = (progress, done, start_s)

    def _poll_cuda(self) -> None:
        for job_id in [j for j, (_, event, _) in self._in_flight.items() if event.query()]:
            progress, _, start_s = self._in_flight.pop(job_id)
            progress.duration_s = time.perf_counter() - start_s
            if self._audit is not None:
                items = self._items([s for s in progress.job.segments if s.row >= 0], progress)
                self._audit_segments(progress.job.kind, progress.job.segments, items, progress)
            self._finish(progress)
