"""The event bus: fans internal events out to sinks, each behind its own bounded queue.

Threading contract: the bus lives on one asyncio loop (the tier service's). `publish` is called on
that loop's thread and never blocks or awaits; other threads call `publish_threadsafe`. Each sink
has a bounded queue and one task draining it in batches; when a sink's queue is full the batch is
dropped for that sink and counted, so a slow sink never stalls a publisher or another sink.

Metrics, if given, count what each sink wrote, dropped and failed. The events themselves are
counted by whoever takes them from the index (`KVStoreMetrics.record_events`), sinks or not:
the bus does not count them again.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass

from kvstore.errors import ConfigError
from kvstore.eventbus.sink import EventSink
from kvstore.events import TierEvent
from kvstore.metrics import KVStoreMetrics

__all__ = ["EventBus", "SinkStats"]

logger = logging.getLogger(__name__)

_MIN_SINK_CLOSE_S = 0.5
"""Each sink gets at least this long to close, even past the deadline (files, sockets)."""


@dataclass(frozen=True, slots=True)
class SinkStats:
    name: str
    num_written_events: int
    num_dropped_batches: int
    num_dropped_events: int
    num_errors: int
    queue_depth: int


class _SinkWorker:
    """One sink, its bounded queue, the task draining it, and its counters."""

    def __init__(self, sink: EventSink, max_queued_batches: int) -> None:
        self.sink = sink
        self.name = sink.name
        self.queue: asyncio.Queue[tuple[TierEvent, ...]] = asyncio.Queue(max_queued_batches)
        self.task: asyncio.Task[None] | None = None
        self.num_written_events = 0
        self.num_dropped_batches = 0
        self.num_dropped_events = 0
        self.num_errors = 0

    def stats(self) -> SinkStats:
        return SinkStats(
            name=self.name,
            num_written_events=self.num_written_events,
            num_dropped_batches=self.num_dropped_batches,
            num_dropped_events=self.num_dropped_events,
            num_errors=self.num_errors,
            queue_depth=self.queue.qsize(),
        )


class EventBus:
    """Owns its sinks and their drain tasks: `start()`, `publish()`..., `close(deadline_s)`.

    `max_queued_batches` bounds each sink's queue (in published batches); a drain task hands a
    sink at most about `max_events_per_write` events per `write`.
    """

    def __init__(
        self,
        sinks: Sequence[EventSink],
        *,
        metrics: KVStoreMetrics | None = None,
        max_queued_batches: int = 1024,
        max_events_per_write: int = 4096,
    ) -> None:
        names = [sink.name for sink in sinks]
        if len(set(names)) != len(names):
            raise ConfigError(f"event sink names must be unique, got {names}")
        if max_queued_batches < 1 or max_events_per_write < 1:
            raise ConfigError(
                f"max_queued_batches ({max_queued_batches}) and max_events_per_write "
                f"({max_events_per_write}) must be >= 1"
            )
        self._workers = [_SinkWorker(sink, max_queued_batches) for sink in sinks]
        self._metrics = metrics
        self._max_events_per_write = max_events_per_write
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread_id: int | None = None
        self._stopping = asyncio.Event()  # set once: intake is closed
        self._is_closed = False
        if metrics is not None:
            for name in names:
                metrics.add_sink(name)

    # -- lifecycle -----------------------------------------------------------------------------

    async def start(self) -> None:
        """Start the sinks in order, then one drain task per sink; returns once all run.

        If a sink fails to start, the ones already started are closed and the error raised.
        """
        if self._loop is not None:
            raise RuntimeError("EventBus.start() called twice")
        self._loop = asyncio.get_running_loop()
        self._loop_thread_id = threading.get_ident()
        for i, worker in enumerate(self._workers):
            try:
                await worker.sink.start()
            except BaseException:
                for started in reversed(self._workers[:i]):
                    await _close_quietly(started.sink)
                self._is_closed = True
                self._stopping.set()
                raise
        running = [asyncio.Event() for _ in self._workers]
        for worker, is_running in zip(self._workers, running, strict=True):
            worker.task = asyncio.create_task(
                self._drain(worker, is_running), name=f"eventbus-sink-{worker.name}"
            )
        await asyncio.gather(*(event.wait() for event in running))

    async def close(self, deadline_s: float = 5.0) -> list[BaseException]:
        """Stop intake, drain until the deadline, cancel, close sinks in order; return errors.

        Order: (1) refuse new batches, (2) let each sink drain its queue until `deadline_s`,
        (3) cancel the drain tasks and count what was left as dropped, (4) close each sink (each
        gets at least a short grace even past the deadline). Idempotent.
        """
        if self._is_closed:
            return []
        self._is_closed = True
        loop = asyncio.get_running_loop()
        deadline = loop.time() + deadline_s
        self._stopping.set()  # (1)
        tasks = [w.task for w in self._workers if w.task is not None]
        if tasks:  # (2)
            await self._join_queues(max(0.0, deadline - loop.time()))
        errors = await self._cancel_drains(tasks, deadline_s)  # (3)
        for worker in self._workers:  # (4)
            timeout_s = max(deadline - loop.time(), _MIN_SINK_CLOSE_S)
            try:
                await asyncio.wait_for(worker.sink.close(), timeout_s)
            except Exception as exc:
                errors.append(exc)
        for error in errors:
            logger.warning("event bus close: %s", error)
        return errors

    async def _join_queues(self, timeout_s: float) -> None:
        """Wait until every sink's queue is drained, or `timeout_s`."""
        joins = [asyncio.create_task(w.queue.join()) for w in self._workers]
        _, pending = await asyncio.wait(joins, timeout=timeout_s)
        for join in pending:
            join.cancel()
        await asyncio.gather(*pending, return_exceptions=True)

    async def _cancel_drains(
        self, tasks: list[asyncio.Task[None]], deadline_s: float
    ) -> list[BaseException]:
        """Cancel the drain tasks; count what each sink had left as dropped, one error each."""
        errors: list[BaseException] = []
        dropped_before = [w.num_dropped_events for w in self._workers]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for worker, before in zip(self._workers, dropped_before, strict=True):
            self._discard_queue(worker)
            num_left = worker.num_dropped_events - before
            if num_left:
                errors.append(
                    TimeoutError(
                        f"event sink {worker.name!r}: {num_left} events not written "
                        f"within the {deadline_s} s close deadline"
                    )
                )
        return errors

    # -- intake --------------------------------------------------------------------------------

    def publish(self, events: Sequence[TierEvent]) -> None:
        """Queue `events` (one batch, in order) for every sink. Loop thread only; never blocks."""
        if self._loop_thread_id != threading.get_ident():
            raise RuntimeError(
                "EventBus.publish() must be called on the bus's loop thread after start(); "
                "use publish_threadsafe() from other threads"
            )
        batch = tuple(events)
        if not batch:
            return
        if self._stopping.is_set():
            for worker in self._workers:
                self._count_drop(worker, len(batch), "closed")
            return
        for worker in self._workers:
            try:
                worker.queue.put_nowait(batch)
            except asyncio.QueueFull:
                self._count_drop(worker, len(batch), "queue_full")

    def publish_threadsafe(self, events: Sequence[TierEvent]) -> None:
        """`publish` from any thread (scheduled on the bus's loop)."""
        if self._loop is None:
            raise RuntimeError("EventBus.publish_threadsafe() called before start()")
        batch = tuple(events)
        try:
            self._loop.call_soon_threadsafe(self.publish, batch)
        except RuntimeError:  # the loop is closed: the bus is gone
            for worker in self._workers:
                self._count_drop(worker, len(batch), "closed")

    # -- introspection -------------------------------------------------------------------------

    def stats(self) -> tuple[SinkStats, ...]:
        return tuple(worker.stats() for worker in self._workers)

    def sink_stats(self, name: str) -> SinkStats:
        for worker in self._workers:
            if worker.name == name:
                return worker.stats()
        raise KeyError(f"no event sink named {name!r}; sinks: {[w.name for w in self._workers]}")

    # -- internals -----------------------------------------------------------------------------

    def _count_drop(self, worker: _SinkWorker, num_events: int, reason: str) -> None:
        worker.num_dropped_batches += 1
        worker.num_dropped_events += num_events
        if self._metrics is not None:
            self._metrics.record_sink_drop(worker.name, num_events, reason)

    def _discard_queue(self, worker: _SinkWorker) -> None:
        while not worker.queue.empty():
            batch = worker.queue.get_nowait()
            worker.queue.task_done()
            self._count_drop(worker, len(batch), "deadline")

    async def _drain(self, worker: _SinkWorker, is_running: asyncio.Event) -> None:
        is_running.set()
        while True:
            batch = list(await worker.queue.get())
            num_batches = 1
            while len(batch) < self._max_events_per_write and not worker.queue.empty():
                batch.extend(worker.queue.get_nowait())
                num_batches += 1
            try:
                await worker.sink.write(batch)
            except asyncio.CancelledError:  # close() ran out of time mid-write
                self._count_drop(worker, len(batch), "deadline")
                raise
            except Exception:
                worker.num_errors += 1
                if self._metrics is not None:
                    self._metrics.record_sink_error(worker.name)
                level = logging.WARNING if worker.num_errors == 1 else logging.DEBUG
                logger.log(level, "event sink %r failed to write", worker.name, exc_info=True)
            else:
                worker.num_written_events += len(batch)
                if self._metrics is not None:
                    self._metrics.record_sink_written(worker.name, len(batch))
            finally:
                for _ in range(num_batches):
                    worker.queue.task_done()


async def _close_quietly(sink: EventSink) -> None:
    try:
        await sink.close()
    except Exception:
        logger.warning("event sink %r failed to close", sink.name, exc_info=True)
