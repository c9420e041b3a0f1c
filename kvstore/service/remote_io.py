"""`RemoteIO`: the remote tier's I/O on the tier service's event loop (redis.asyncio).

Probes (which of these chunks does Redis hold?), fetches into CPU rows, and write-through from
CPU rows, each bounded by `remote_timeout_ms` and the circuit breakers of `RemoteStore`: a dead
or slow Redis answers "miss" within the budget, never hangs a request. Writes are batched,
bounded (`remote_queue_chunks`) and dropped (counted) when the queue is full. Redis's own
removals (evicted, expired, deleted) arrive from a `RemovalWatcher`. Every result is posted to
the owner's completion queue, like the disk's; every task is owned (a task that dies posts a
failure for its work, so rows are unpinned and holds released).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Coroutine, Sequence
from typing import Any

from kvstore.keys import BlockKey
from kvstore.metrics import Direction, KVStoreMetrics, QueueName
from kvstore.remote import RemoteChunks, RemovalWatcher
from kvstore.service.completions import (
    RemoteCompletion,
    RemoteFetchDone,
    RemoteMeasureDone,
    RemoteProbeDone,
    RemoteRemoved,
    RemoteWriteDone,
)
from kvstore.service.disk_io import RowBuffers
from kvstore.service.loop import LoopThread
from kvstore.tasks import OwnedTasks

__all__ = ["RemoteIO"]

logger = logging.getLogger(__name__)


class RemoteIO:
    """See the module docstring. `submit_*` from the owner thread; never blocks."""

    def __init__(
        self,
        chunks: RemoteChunks,
        rows: RowBuffers,
        loop_thread: LoopThread,
        completions: queue.SimpleQueue[Any],
        *,
        metrics: KVStoreMetrics | None = None,
        max_queued_chunks: int = 256,
    ) -> None:
        self._chunks = chunks
        self._rows = rows
        self._loop_thread = loop_thread
        self._completions = completions
        self._metrics = metrics
        self._max_queued_chunks = max_queued_chunks
        self._lock = threading.Lock()
        self._num_queued_chunks = 0
        self._watcher: RemovalWatcher | None = None
        self._tasks = OwnedTasks("remote")
        self._is_closing = False

    @property
    def chunks(self) -> RemoteChunks:
        return self._chunks

    @property
    def num_queued_chunks(self) -> int:
        return self._num_queued_chunks

    # -- lifecycle (loop thread) ------------------------------------------------------------

    @property
    def start_bound_s(self) -> float:
        """The most `start` takes: a connect and a subscribe, each within the timeout."""
        return 2 * self._chunks.store.config.timeout_s

    async def start(self) -> None:
        """Connect (an unreachable server is a warning: the breakers retry later) and follow
        Redis's removals. A refused password raises (a config error)."""
        store = self._chunks.store
        if not await store.connect():
            logger.warning("kvstore remote tier unreachable at start; serving from CPU and "
                           "disk, retrying in the background")  # fmt: skip
        self._watcher = RemovalWatcher(store, self._chunks.namespace_id, _Sink(self))
        started = await self._watcher.start(timeout_s=store.config.timeout_s)
        if not started:
            logger.warning("kvstore remote tier: removal events not subscribed yet (retrying)")

    async def close(self, deadline_s: float) -> None:
        self._is_closing = True
        await self._tasks.close(deadline_s)
        left = max(0.1, deadline_s - time.monotonic())
        if self._watcher is not None:
            await self._watcher.close(timeout_s=left)
        await self._chunks.store.close()

    # -- intake (owner thread) --------------------------------------------------------------

    def submit_probe(self, keys: Sequence[BlockKey], tag: object) -> None:
        keys = tuple(keys)
        failed = RemoteProbeDone(keys, (False,) * len(keys), tag)
        self._run(self._probe(keys, tag), failed)

    def submit_fetch(self, items: Sequence[tuple[BlockKey, int]], tag: object) -> None:
        """Copy each chunk into its CPU row (pinned by the caller until the answer)."""
        keys = tuple(key for key, _ in items)
        self._run(self._fetch(list(items), tag), RemoteFetchDone((), keys, tag))

    def submit_measure(self, keys: Sequence[BlockKey], tag: object) -> None:
        """Read the chunks and drop them: a measurement of the link (`RemoteMeasureDone`)."""
        keys = tuple(keys)
        self._run(self._measure(keys, tag), RemoteMeasureDone(tag=tag))

    def submit_write(self, items: Sequence[tuple[BlockKey, int]]) -> bool:
        """Queue a write-through batch from pinned CPU rows; False = dropped (queue full or
        closing): the caller unpins them."""
        if self._is_closing or not self._chunks.store.config.enable_write:
            return False
        with self._lock:
            if self._num_queued_chunks + len(items) > self._max_queued_chunks:
                full = True
            else:
                full = False
                self._num_queued_chunks += len(items)
        if full:
            if self._metrics is not None:
                self._metrics.record_queue_drop(QueueName.REMOTE_WRITE, len(items))
            return False
        keys = tuple(key for key, _ in items)
        self._run(self._write(list(items)), RemoteWriteDone((), keys), num_chunks=len(items))
        return True

    def submit_touch(self, keys: Sequence[BlockKey]) -> None:
        """TOUCH the chunks (Redis's LRU sees the access); best effort, nothing answered."""
        if self._is_closing or not keys:
            return
        keys = tuple(keys)
        self._loop_thread.call_soon(self._spawn_touch, keys)

    def _spawn_touch(self, keys: tuple[BlockKey, ...]) -> None:
        self._tasks.spawn(self._chunks.touch(keys), name="RemoteTouch", on_death=_ignore)

    def _run(
        self, coro: Coroutine[Any, Any, None], on_death: Any, *, num_chunks: int = 0
    ) -> None:
        if self._is_closing:
            coro.close()
            self._post(on_death, num_chunks)
            return
        self._loop_thread.call_soon(self._spawn, coro, on_death, num_chunks)

    def _spawn(
        self, coro: Coroutine[Any, Any, None], on_death: RemoteCompletion, num_chunks: int
    ) -> None:
        self._tasks.spawn(
            coro, name=type(on_death).__name__, is_failed_if_cancelled=True,
            on_death=lambda exc: self._post(on_death, num_chunks),
        )  # fmt: skip

    def _post(self, completion: RemoteCompletion, num_chunks: int = 0) -> None:
        if num_chunks:
            with self._lock:
                self._num_queued_chunks -= num_chunks
        self._completions.put(completion)

    # -- the work (loop thread) -------------------------------------------------------------

    async def _probe(self, keys: tuple[BlockKey, ...], tag: object) -> None:
        start_s = time.perf_counter()
        found, answered = await self._chunks.probe(keys)
        duration_s = time.perf_counter() - start_s
        self._post(RemoteProbeDone(keys, tuple(found), tag, duration_s, answered))

    async def _fetch(self, items: list[tuple[BlockKey, int]], tag: object) -> None:
        start_s = time.perf_counter()
        keys = [key for key, _ in items]
        loaded = await self._chunks.load_into(keys, [self._rows.row(row) for _, row in items])
        ok = tuple(key for key, hit in zip(keys, loaded, strict=True) if hit)
        failed = tuple(key for key, hit in zip(keys, loaded, strict=True) if not hit)
        num_bytes = self._bytes(items, len(ok))
        duration_s = self._observe(Direction.REMOTE_TO_CPU, num_bytes, start_s, not failed)
        self._post(RemoteFetchDone(ok, failed, tag, num_bytes, duration_s))

    async def _measure(self, keys: tuple[BlockKey, ...], tag: object) -> None:
        start_s = time.perf_counter()
        num_bytes = await self._chunks.measure(keys)
        self._post(RemoteMeasureDone(num_bytes, time.perf_counter() - start_s, tag))

    async def _write(self, items: list[tuple[BlockKey, int]]) -> None:
        start_s = time.perf_counter()
        landed = await self._chunks.store_many([(k, self._rows.row(r)) for k, r in items])
        ok = tuple(key for (key, _), hit in zip(items, landed, strict=True) if hit)
        failed = tuple(key for (key, _), hit in zip(items, landed, strict=True) if not hit)
        num_bytes = self._bytes(items, len(ok))
        duration_s = self._observe(Direction.CPU_TO_REMOTE, num_bytes, start_s, not failed)
        self._post(RemoteWriteDone(ok, failed, num_bytes, duration_s), len(items))

    def _bytes(self, items: Sequence[tuple[BlockKey, int]], num_ok: int) -> int:
        return num_ok * len(self._rows.row(items[0][1])) if items else 0

    def _observe(self, direction: Direction, num_bytes: int, start_s: float, is_ok: bool) -> float:
        """Record the transfer's metrics; returns its duration."""
        duration_s = time.perf_counter() - start_s
        if self._metrics is not None:
            self._metrics.observe_transfer(direction, num_bytes, duration_s, is_ok)
        return duration_s


def _ignore(exc: BaseException) -> None:
    """A touch that failed (remote down, closing) changes nothing worth a retry."""


class _Sink:
    """Redis's removals, posted to the owner."""

    def __init__(self, io: RemoteIO) -> None:
        self._io = io

    def removed(self, keys: Sequence[BlockKey]) -> None:
        if keys:
            self._io._post(RemoteRemoved(tuple(keys)))

    def resubscribed(self, node: str) -> None:
        logger.info("kvstore remote tier: removal events from %s resumed; removals during the "
                    "gap were not seen", node)  # fmt: skip

