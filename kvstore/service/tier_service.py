"""TierService: the scheduler process's I/O, on an asyncio loop in a dedicated thread.

It copies chunks CPU row -> LMDB (write-through) and LMDB -> CPU row (promotion), deletes disk
victims, batches last-access updates and fans events out to the sinks. vLLM's scheduler thread
enters only through the thread-safe `submit_*`/`publish` calls, which never block: the write
queue is bounded in chunks and a full queue drops the write-through (counted), never the step.
Results come back through `drain_completions()`, which the index's owner applies.

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
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol

from kvstore.events import TierEvent
from kvstore.keys import BlockKey, Tier
from kvstore.metrics import Direction, IOOp, KVStoreMetrics, QueueName
from kvstore.service.completions import Completion, PromotionDone
from kvstore.service.disk_io import DiskIO, IOReport
from kvstore.service.loop import LoopThread

__all__ = ["EventPublisher", "TierService"]

logger = logging.getLogger(__name__)

_WRITE_BATCH_CHUNKS = 64
_TOUCH_FLUSH_INTERVAL_S = 1.0


_WriteJob = tuple[list[tuple[BlockKey, int]], list[BlockKey], Callable[[], object] | None]


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
    ) -> None:
        self._disk = disk
        self._metrics = metrics
        self._publisher = publisher
        self._max_queued_chunks = max_queued_chunks
        self._shutdown_timeout_s = shutdown_timeout_s
        self._loop_thread = LoopThread()
        self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kvstore-lmdb-w")
        self._readers = ThreadPoolExecutor(max_workers=2, thread_name_prefix="kvstore-lmdb-r")
        self._completions: queue.SimpleQueue[Completion] = queue.SimpleQueue()
        self._count_lock = threading.Lock()
        self._num_queued_chunks = 0
        self._num_inflight_promotions = 0
        self._is_closing = False
        self._is_closed = False
        # Loop-thread state (created in _start_async):
        self._write_queue: asyncio.Queue[_WriteJob]
        self._touched: set[BlockKey] = set()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._stop_event: asyncio.Event

    # -- lifecycle --------------------------------------------------------------------------

    def start(self) -> None:
        self._loop_thread.start()
        self._loop_thread.submit(self._start_async()).result(timeout=10.0)

    async def _start_async(self) -> None:
        self._write_queue = asyncio.Queue()
        self._stop_event = asyncio.Event()
        if self._publisher is not None:
            await self._publisher.start()
        if self._disk is not None:
            self._spawn(self._write_loop())
            self._spawn(self._touch_loop())

    def _spawn(self, coro: Any) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    @property
    def has_disk(self) -> bool:
        return self._disk is not None

    @property
    def num_queued_chunks(self) -> int:
        return self._num_queued_chunks

    @property
    def num_inflight_promotions(self) -> int:
        return self._num_inflight_promotions

    def close(self) -> None:
        """Stop intake, drain with a deadline, cancel, sync and close LMDB, flush sinks."""
        if self._is_closed:
            return
        self._is_closing = True
        try:
            if self._loop_thread.is_running:
                future = self._loop_thread.submit(self._close_async())
                future.result(timeout=self._shutdown_timeout_s + 5.0)
        except Exception as exc:
            logger.error("kvstore service shutdown was not clean: %s", exc)
        finally:
            self._writer.shutdown(wait=True, cancel_futures=True)
            self._readers.shutdown(wait=True, cancel_futures=True)
            if self._disk is not None:
                try:
                    self._disk.close()
                except Exception as exc:
                    logger.error("kvstore could not close the disk store cleanly: %s", exc)
            self._loop_thread.stop()
            self._is_closed = True

    async def _close_async(self) -> None:
        deadline_s = time.monotonic() + self._shutdown_timeout_s
        # 1. drain queued writes (the write loop keeps running) until empty or the deadline
        while self._num_queued_chunks > 0 and time.monotonic() < deadline_s:
            await asyncio.sleep(0.01)
        # 2. final touch flush, then stop and cancel background tasks
        await self._flush_touches()
        self._stop_event.set()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        # 3. flush event sinks with what is left of the deadline
        if self._publisher is not None:
            await self._publisher.close(max(0.1, deadline_s - time.monotonic()))

    # -- intake (owner thread; never blocks) ------------------------------------------------

    def submit_write(
        self, items: Sequence[tuple[BlockKey, int]], victims: Sequence[BlockKey]
    ) -> bool:
        """Queue a write-through batch. False = dropped (queue full or closing): not written."""
        if self._disk is None or self._is_closing or (not items and not victims):
            return not items
        with self._count_lock:
            if self._num_queued_chunks + len(items) > self._max_queued_chunks:
                dropped = True
            else:
                dropped = False
                self._num_queued_chunks += len(items)
        if dropped:
            if self._metrics is not None:
                self._metrics.record_queue_drop(QueueName.WRITE_THROUGH, len(items))
            if victims:  # the index already let them go: delete them anyway
                self._loop_thread.call_soon(self._enqueue_write, [], list(victims))
            return False
        self._loop_thread.call_soon(self._enqueue_write, list(items), list(victims))
        return True

    def submit_promotion(self, items: Sequence[tuple[BlockKey, int]]) -> bool:
        """Read disk chunks into their CPU rows; the result arrives as a PromotionDone."""
        if self._disk is None or self._is_closing:
            return False
        with self._count_lock:
            self._num_inflight_promotions += 1
        self._loop_thread.call_soon(self._start_promotion, list(items))
        return True

    def submit_call(self, fn: Callable[[], object]) -> None:
        """Run `fn` on the LMDB writer thread, in order with the queued writes."""
        if self._disk is not None and not self._is_closing:
            self._loop_thread.call_soon(self._write_queue.put_nowait, ([], [], fn))

    def submit_delete(self, keys: Sequence[BlockKey]) -> None:
        if self._disk is not None and keys and not self._is_closing:
            self._loop_thread.call_soon(self._enqueue_write, [], list(keys))

    def submit_touch(self, keys: Sequence[BlockKey]) -> None:
        if self._disk is not None and keys and not self._is_closing:
            self._loop_thread.call_soon(self._touched.update, list(keys))

    def publish(self, events: Sequence[TierEvent]) -> None:
        if self._publisher is not None and events and not self._is_closing:
            self._loop_thread.call_soon(self._publisher.publish, list(events))

    def drain_completions(self) -> list[Completion]:
        out: list[Completion] = []
        while True:
            try:
                out.append(self._completions.get_nowait())
            except queue.Empty:
                return out

    # -- loop thread ------------------------------------------------------------------------

    def _enqueue_write(self, items: list[tuple[BlockKey, int]], victims: list[BlockKey]) -> None:
        self._write_queue.put_nowait((items, victims, None))

    async def _write_loop(self) -> None:
        assert self._disk is not None
        loop = asyncio.get_running_loop()
        carry: _WriteJob | None = None
        while True:
            job = carry if carry is not None else await self._write_queue.get()
            carry = None
            items, victims, call = job
            if call is not None:
                await loop.run_in_executor(self._writer, _run_logged, call)
                continue
            while len(items) < _WRITE_BATCH_CHUNKS and not self._write_queue.empty():
                more = self._write_queue.get_nowait()
                if more[2] is not None:
                    carry = more  # a call runs after this batch, in order
                    break
                items += more[0]
                victims += more[1]
            if not items:
                await loop.run_in_executor(self._writer, self._disk.delete, victims)
                continue
            done, report = await loop.run_in_executor(
                self._writer, self._disk.write, items, victims
            )
            with self._count_lock:
                self._num_queued_chunks -= len(items)
            self._completions.put(done)
            self._record(report, IOOp.WRITE)
            if self._metrics is not None:
                self._metrics.set_queue_depth(
                    QueueName.WRITE_THROUGH, self._num_queued_chunks, self._max_queued_chunks
                )

    def _start_promotion(self, items: list[tuple[BlockKey, int]]) -> None:
        self._spawn(self._promote(items))

    async def _promote(self, items: list[tuple[BlockKey, int]]) -> None:
        assert self._disk is not None
        loop = asyncio.get_running_loop()
        try:
            done, report = await loop.run_in_executor(self._readers, self._disk.read, items)
        except Exception as exc:  # executor shut down mid-flight
            logger.warning("kvstore promotion of %d chunks abandoned: %s", len(items), exc)
            done = PromotionDone(ok=(), failed=tuple(k for k, _ in items))
            report = IOReport("disk_to_cpu", 0, 0.0, False)
        if done.corrupt:
            await loop.run_in_executor(self._writer, self._disk.delete, list(done.corrupt))
        with self._count_lock:
            self._num_inflight_promotions -= 1
        self._completions.put(done)
        self._record(report, IOOp.READ)

    async def _touch_loop(self) -> None:
        while not self._stop_event.is_set():
            await asyncio.sleep(_TOUCH_FLUSH_INTERVAL_S)
            await self._flush_touches()

    async def _flush_touches(self) -> None:
        if self._disk is None or not self._touched:
            return
        keys, self._touched = list(self._touched), set()
        await asyncio.get_running_loop().run_in_executor(self._writer, self._disk.touch, keys)

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
