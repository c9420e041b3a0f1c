"""TierService: the scheduler process's I/O, on an asyncio loop in a dedicated thread.

It copies chunks CPU row -> LMDB (write-through) and LMDB -> CPU row (promotion), deletes disk
victims, batches last-access updates and fans events out to the sinks. vLLM's scheduler thread
enters only through the thread-safe `submit_*`/`publish` calls, which never block: the write
queue is bounded in chunks and a full queue drops the write-through (counted), never the step.
Results come back through `drain_completions()`, which the index's owner applies.

Every background task is owned: a task that dies is logged once, its pending work is failed
back to the owner (so pinned CPU rows are released and the writes counted as failed), and it
is restarted, up to `_MAX_RESTARTS` times; after that the disk tier is marked down
(`kvstore_tier_up{tier="disk"} 0`) and write-throughs are dropped, never silently lost.
`close()` has one deadline for everything: draining, tasks, sinks and the I/O threads.
With `hold_writes` the writer thread runs nothing until `release_writes()` (the connector
registers its disk namespace then, once a worker reported the chunk layout).

Threading: every `submit_*`, `publish`, `drain_completions` and `close` call comes from one
owner thread (vLLM's scheduler thread); the loop thread owns the queues and tasks; LMDB writes
run on exactly one executor thread, reads on a small pool.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Protocol

from kvstore.events import TierEvent
from kvstore.keys import BlockKey, Tier
from kvstore.metrics import Direction, IOOp, KVStoreMetrics, QueueName
from kvstore.remote import RemoteChunks
from kvstore.service.completions import Completion, PromotionDone, WriteDone
from kvstore.service.disk_io import DiskIO, IOReport, RowBuffers
from kvstore.service.executors import DaemonExecutor
from kvstore.service.loop import LoopThread
from kvstore.service.remote_io import RemoteIO
from kvstore.service.write_queue import WriteJob, WriteQueue
from kvstore.tasks import OwnedTasks

__all__ = ["EventPublisher", "TierService"]

logger = logging.getLogger(__name__)

_TOUCH_FLUSH_INTERVAL_S = 1.0
_START_TIMEOUT_S = 10.0  # the local tiers' start (and the remote's, on top of its own bound)
_MAX_RESTARTS = 3


def _run_logged(fn: Callable[[], object]) -> None:
    try:
        fn()
    except Exception as exc:
        logger.error("kvstore writer-thread call failed: %s", exc)


class EventPublisher(Protocol):
    async def start(self) -> None: ...

    def publish(self, events: Sequence[TierEvent]) -> None: ...

    async def close(self, deadline_s: float) -> object: ...


class TierService:
    """Disk I/O and event fan-out off vLLM's scheduler thread (see the module docstring)."""

    def __init__(
        self,
        *,
        disk: DiskIO | None,
        metrics: KVStoreMetrics | None = None,
        publisher: EventPublisher | None = None,
        max_queued_chunks: int = 256,
        shutdown_timeout_s: float = 10.0,
        remote: RemoteChunks | None = None,
        remote_rows: RowBuffers | None = None,
        remote_queue_chunks: int = 256,
        num_read_threads: int = 2,
        hold_writes: bool = False,
    ) -> None:
        self._disk = disk
        self._metrics = metrics
        self._publisher = publisher
        self._max_queued_chunks = max_queued_chunks
        self._shutdown_timeout_s = shutdown_timeout_s
        self._loop_thread = LoopThread()
        self._writer = DaemonExecutor(1, "kvstore-lmdb-w")
        self._readers = DaemonExecutor(num_read_threads, "kvstore-lmdb-r")
        self._completions: queue.SimpleQueue[Completion] = queue.SimpleQueue()
        self._remote = self._make_remote(remote, remote_rows, remote_queue_chunks)
        self._count_lock = threading.Lock()
        self._num_queued_chunks = 0
        self._num_queued_jobs = 0  # every job (writes, deletes, calls) until its batch ran
        self._num_inflight_promotions = 0
        self._is_disk_up = disk is not None
        self._hold_writes = hold_writes and disk is not None  # until release_writes()
        self._is_closing = False
        self._is_closed = False
        # Loop-thread state (created in _start_async):
        self._queue: WriteQueue
        self._writing: WriteJob | None = None  # the batch the write loop holds
        self._touched: set[BlockKey] = set()
        self._tasks = OwnedTasks("disk", max_restarts=_MAX_RESTARTS, on_give_up=self._disk_down)

    def _make_remote(
        self, remote: RemoteChunks | None, rows: RowBuffers | None, max_queued_chunks: int
    ) -> RemoteIO | None:
        if remote is None:
            return None
        if rows is None:
            raise ValueError("a remote tier needs remote_rows (the CPU region)")
        return RemoteIO(
            remote,
            rows,
            self._loop_thread,
            self._completions,
            metrics=self._metrics,
            max_queued_chunks=max_queued_chunks,
        )

    # -- lifecycle --------------------------------------------------------------------------

    def start(self) -> None:
        """Start the loop and the tiers' tasks, within `_START_TIMEOUT_S` plus what the remote
        tier's own start may take (a connect and a subscribe, each within its timeout)."""
        self._loop_thread.start()
        timeout_s = _START_TIMEOUT_S
        if self._remote is not None:
            timeout_s += self._remote.start_bound_s
        self._loop_thread.submit(self._start_async()).result(timeout=timeout_s)

    async def _start_async(self) -> None:
        self._queue = WriteQueue(is_held=self._hold_writes)
        if self._publisher is not None:
            await self._publisher.start()
        if self._disk is not None:
            self._spawn_writer()
            self._tasks.spawn(
                self._touch_loop(), name="toucher", on_death=self._on_toucher_died,
                restart=self._touch_loop,
            )  # fmt: skip
        if self._remote is not None:
            await self._remote.start()

    def _spawn_writer(self) -> None:
        self._tasks.spawn(
            self._write_loop(), name="writer", on_death=self._on_writer_died,
            restart=self._write_loop,
        )  # fmt: skip

    @property
    def has_disk(self) -> bool:
        return self._disk is not None

    @property
    def remote(self) -> RemoteIO | None:
        """The remote tier's I/O (same loop, same completion queue), when configured."""
        return self._remote

    @property
    def is_disk_up(self) -> bool:
        return self._is_disk_up

    @property
    def num_queued_chunks(self) -> int:
        return self._num_queued_chunks

    def close(self) -> bool:
        """Within `shutdown_timeout_s` in all: stop intake, drain the writes, stop the tasks,
        flush the sinks, stop the I/O threads, then sync and close LMDB (only if no thread
        still uses it). True once closed; False when an I/O thread was still running at the
        deadline: the store is left open, and a later call waits for the threads again (another
        `shutdown_timeout_s`) and closes it."""
        if self._is_closed:
            return True
        deadline_s = time.monotonic() + self._shutdown_timeout_s
        if not self._is_closing:
            self._is_closing = True
            self._close_loop(deadline_s)
        is_idle = self._writer.shutdown(max(0.0, deadline_s - time.monotonic()))
        is_idle = self._readers.shutdown(max(0.0, deadline_s - time.monotonic())) and is_idle
        self._loop_thread.stop()
        if not is_idle:
            if self._disk is not None:
                logger.error("kvstore: disk I/O still running at shutdown; the store is left open")
            return False
        if self._disk is not None:
            try:
                self._disk.close()
            except Exception as exc:
                logger.error("kvstore could not close the disk store cleanly: %s", exc)
        self._is_closed = True
        return True

    def _close_loop(self, deadline_s: float) -> None:
        try:
            if self._loop_thread.is_running:
                future = self._loop_thread.submit(self._close_async(deadline_s))
                future.result(timeout=max(0.1, deadline_s - time.monotonic()) + 1.0)
        except Exception as exc:
            logger.error("kvstore service shutdown was not clean: %s", exc)

    async def _close_async(self, deadline_s: float) -> None:
        if self._queue.is_held:  # no worker ever reported its layout: nothing may reach LMDB
            self._drop_held()
        # 1. drain queued writes (the write loop keeps running) until done or the deadline
        try:
            await asyncio.wait_for(self._queue.idle.wait(), max(0.0, deadline_s - time.monotonic()))
        except TimeoutError:
            logger.warning("kvstore: %d queued disk writes dropped at shutdown",
                           self._num_queued_chunks)  # fmt: skip
        # 2. final touch flush, then cancel the background tasks
        if self._is_disk_up:
            await self._flush_touches()
        await self._tasks.close(deadline_s)
        # 3. the remote tier's tasks, subscriptions and connections
        if self._remote is not None:
            await self._remote.close(deadline_s)
        # 4. flush event sinks with what is left of the deadline
        if self._publisher is not None:
            await self._publisher.close(max(0.1, deadline_s - time.monotonic()))

    # -- intake (owner thread; never blocks) ------------------------------------------------

    def submit_write(
        self, items: Sequence[tuple[BlockKey, int]], victims: Sequence[BlockKey]
    ) -> bool:
        """Queue a write-through batch. False = dropped (queue full, disk down or closing):
        not written, the caller ends it as failed."""
        if self._disk is None or self._is_closing or (not items and not victims):
            return not items
        if not self._is_disk_up:
            self._record_drop(len(items), "tier_down")
            return not items
        with self._count_lock:
            is_full = self._num_queued_chunks + len(items) > self._max_queued_chunks
            if not is_full:
                self._num_queued_chunks += len(items)
        if is_full:
            self._record_drop(len(items), "queue_full")
            if victims:  # the index already let them go: delete them anyway
                self._submit_job(WriteJob([], list(victims)))
            return False
        self._submit_job(WriteJob(list(items), list(victims)))
        return True

    def submit_promotion(self, items: Sequence[tuple[BlockKey, int]], tag: object = None) -> bool:
        """Read disk chunks into their rows (one read transaction); the result arrives as one
        PromotionDone carrying `tag`. False = refused (no disk, or closing)."""
        if self._disk is None or self._is_closing:
            return False
        with self._count_lock:
            self._num_inflight_promotions += 1
        self._loop_thread.call_soon(self._start_promotion, list(items), tag)
        return True

    def wait_idle(self, timeout_s: float) -> bool:
        """Block (the owner thread) until no write, delete or call is queued and no promotion
        in flight; False if `timeout_s` passed first. Not for the step path: for drains and
        shutdown."""
        deadline_s = time.monotonic() + timeout_s
        while (
            self._num_queued_jobs
            or self._num_inflight_promotions
            or (self._remote is not None and self._remote.num_queued_chunks)
        ):
            if time.monotonic() >= deadline_s:
                return False
            time.sleep(0.002)
        return True

    def release_writes(self, first: Callable[[], object] | None = None) -> None:
        """Start the writer thread's work held since start (`hold_writes`), `first` before
        any of it: the engine's disk namespace is registered once its worker reported the
        chunk layout, and a write queued before that (a remote hit's write-through in the
        first step) must not reach LMDB first. Held jobs count against the queue's bound."""
        if self._disk is None or self._is_closing:
            return
        with self._count_lock:
            self._num_queued_jobs += first is not None
        self._loop_thread.call_soon(self._release, first)

    def _release(self, first: Callable[[], object] | None) -> None:
        self._queue.release(WriteJob([], [], first) if first is not None else None)

    def submit_call(self, fn: Callable[[], object]) -> None:
        """Run `fn` on the LMDB writer thread, in order with the queued writes."""
        if self._disk is not None and not self._is_closing:
            self._submit_job(WriteJob([], [], fn))

    def submit_delete(self, keys: Sequence[BlockKey]) -> None:
        if self._disk is not None and keys and not self._is_closing:
            self._submit_job(WriteJob([], list(keys)))

    def submit_touch(self, keys: Sequence[BlockKey]) -> None:
        if self._disk is not None and keys and not self._is_closing:
            self._loop_thread.call_soon(self._touched.update, list(keys))

    def publish(self, events: Sequence[TierEvent]) -> None:
        if self._publisher is not None and events and not self._is_closing:
            self._loop_thread.call_soon(self._publisher.publish, list(events))

    def drain_completions(self, timeout_s: float = 0.0) -> list[Completion]:
        """The results finished since the last call. With `timeout_s`, when none is ready,
        block (the owner thread) until the first arrives or `timeout_s` passed: for drains and
        shutdown, never the step path."""
        out: list[Completion] = []
        if timeout_s > 0:
            try:
                out.append(self._completions.get(timeout=timeout_s))
            except queue.Empty:
                return out
        while True:
            try:
                out.append(self._completions.get_nowait())
            except queue.Empty:
                return out

    # -- the write loop (loop thread) -------------------------------------------------------

    def _submit_job(self, job: WriteJob) -> None:
        """Queue `job` from any thread; it counts as queued from now (so `wait_idle` and the
        shutdown drain see it) until its batch has run."""
        with self._count_lock:
            self._num_queued_jobs += 1
        self._loop_thread.call_soon(self._queue.append, job)

    def _end_jobs(self, num_jobs: int) -> None:
        with self._count_lock:
            self._num_queued_jobs -= num_jobs

    async def _write_loop(self) -> None:
        while True:
            job = await self._queue.next_batch()
            self._writing = job
            if job.call is not None:
                await asyncio.wrap_future(self._writer.submit(_run_logged, job.call))
            elif not job.items:
                assert self._disk is not None
                await asyncio.wrap_future(self._writer.submit(self._disk.delete, job.victims))
            else:
                await self._write(job)
            self._writing = None
            self._end_jobs(job.num_jobs)
            if not self._queue:
                self._queue.idle.set()

    async def _write(self, job: WriteJob) -> None:
        assert self._disk is not None
        done, report = await asyncio.wrap_future(
            self._writer.submit(self._disk.write, job.items, job.victims)
        )
        self._finish_write(job, done)
        self._record(report, IOOp.WRITE)

    def _finish_write(self, job: WriteJob, done: WriteDone) -> None:
        with self._count_lock:
            self._num_queued_chunks -= len(job.items)
        self._writing = None
        self._completions.put(done)
        if self._metrics is not None:
            self._metrics.set_queue_depth(
                QueueName.WRITE_THROUGH, self._num_queued_chunks, self._max_queued_chunks
            )

    def _on_writer_died(self, exc: BaseException) -> None:
        """Fail the batch in hand and everything queued (the tasks then restart the writer, or
        give up and mark the disk down)."""
        failed = [self._writing] if self._writing is not None else []
        self._writing = None
        self._fail_queued(failed, "tier_down")

    def _fail_queued(self, jobs: list[WriteJob], reason: str) -> None:
        """Fail `jobs` and everything queued: their writes end as failed (rows released)."""
        jobs += self._queue.take_all()
        for job in jobs:
            if job.items:
                self._finish_write(job, WriteDone(ok=(), failed=tuple(k for k, _ in job.items)))
                self._record_drop(len(job.items), reason)
            self._end_jobs(job.num_jobs)
        self._queue.idle.set()

    def _drop_held(self) -> None:
        if self._num_queued_chunks:
            logger.warning("kvstore: %d disk writes dropped at shutdown: the engine's namespace "
                           "was never registered", self._num_queued_chunks)  # fmt: skip
        self._fail_queued([], "closed")

    def _disk_down(self) -> None:
        """The tasks' restart budget is spent: write-throughs are dropped from now on."""
        if self._is_disk_up:
            self._is_disk_up = False
            logger.error("kvstore: disk tier DOWN after %d task failures; write-throughs are "
                         "dropped until restart", self._tasks.num_restarts + 1)  # fmt: skip
            if self._metrics is not None:
                self._metrics.set_tier_up(Tier.DISK, False)

    # -- promotions and touches (loop thread) -----------------------------------------------

    def _start_promotion(self, items: list[tuple[BlockKey, int]], tag: object) -> None:
        failed = PromotionDone(ok=(), failed=tuple(key for key, _ in items), tag=tag)
        self._tasks.spawn(
            self._promote(items, failed), name="promotion",
            on_death=lambda exc: self._end_promotion(failed),
        )  # fmt: skip

    async def _promote(self, items: list[tuple[BlockKey, int]], failed: PromotionDone) -> None:
        assert self._disk is not None
        try:
            done, report = await asyncio.wrap_future(self._readers.submit(self._disk.read, items))
        except RuntimeError as exc:  # the readers were shut down mid-flight
            logger.warning("kvstore promotion of %d chunks abandoned: %s", len(items), exc)
            self._end_promotion(failed)
            return
        if done.corrupt and self._is_disk_up:  # queued before the promotion ends: a drain sees it
            self._submit_job(WriteJob([], list(done.corrupt)))
        self._end_promotion(replace(done, tag=failed.tag))
        self._record(report, IOOp.READ)

    def _end_promotion(self, done: PromotionDone) -> None:
        with self._count_lock:
            self._num_inflight_promotions -= 1
        self._completions.put(done)

    async def _touch_loop(self) -> None:
        while True:
            await asyncio.sleep(_TOUCH_FLUSH_INTERVAL_S)
            await self._flush_touches()

    def _on_toucher_died(self, exc: BaseException) -> None:
        self._touched.clear()  # these hit times are not recorded

    async def _flush_touches(self) -> None:
        if self._disk is None or not self._touched or self._queue.is_held:
            return
        keys, self._touched = list(self._touched), set()
        await asyncio.wrap_future(self._writer.submit(self._disk.touch, keys))

    # -- metrics ----------------------------------------------------------------------------

    def _record_drop(self, num_chunks: int, reason: str) -> None:
        if self._metrics is not None and num_chunks:
            self._metrics.record_queue_drop(QueueName.WRITE_THROUGH, num_chunks, reason)

    def _record(self, report: IOReport, op: IOOp) -> None:
        if self._metrics is None:
            return
        self._metrics.observe_transfer(
            Direction(report.direction), report.num_bytes, report.duration_s, report.is_ok
        )
        if report.num_corrupt:
            self._metrics.record_checksum_failure(Tier.DISK, report.num_corrupt)
        if report.num_io_errors:
            self._metrics.record_io_error(op, report.num_io_errors)
