"""`DaemonExecutor`: a fixed pool of daemon threads whose shutdown has a deadline.

`concurrent.futures.ThreadPoolExecutor` cannot be stopped with a deadline: its threads are
joined at interpreter exit, so one LMDB call stuck on a dead disk would hang the engine's exit.
These threads are daemons; `shutdown(timeout_s)` waits that long and reports whether they all
finished (a caller must then not close what a stuck thread still uses).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

__all__ = ["DaemonExecutor"]

logger = logging.getLogger(__name__)
T = TypeVar("T")

_Work = tuple[Future[Any], Callable[..., Any], tuple[Any, ...]]


class DaemonExecutor:
    """`submit` from any thread; work runs in order per thread, on `num_threads` threads."""

    def __init__(self, num_threads: int, name: str) -> None:
        if num_threads < 1:
            raise ValueError(f"num_threads must be >= 1, got {num_threads}")
        self._work: queue.SimpleQueue[_Work | None] = queue.SimpleQueue()
        self._is_shut_down = False
        self._lock = threading.Lock()
        self._threads = [
            threading.Thread(target=self._run, name=f"{name}-{i}", daemon=True)
            for i in range(num_threads)
        ]
        for thread in self._threads:
            thread.start()

    def submit(self, fn: Callable[..., T], *args: Any) -> Future[T]:
        future: Future[T] = Future()
        with self._lock:
            if self._is_shut_down:
                raise RuntimeError("DaemonExecutor is shut down")
            self._work.put((future, fn, args))
        return future

    def shutdown(self, timeout_s: float) -> bool:
        """Cancel work not yet started, let running work finish within `timeout_s`; True when
        every thread has exited."""
        with self._lock:
            if not self._is_shut_down:
                self._is_shut_down = True
                self._cancel_queued()
                for _ in self._threads:
                    self._work.put(None)
        deadline_s = time.monotonic() + max(0.0, timeout_s)
        for thread in self._threads:
            thread.join(max(0.0, deadline_s - time.monotonic()))
        alive = [t.name for t in self._threads if t.is_alive()]
        if alive:
            logger.error("kvstore: threads still busy %.1f s into shutdown: %s", timeout_s, alive)
        return not alive

    def _cancel_queued(self) -> None:
        while True:
            try:
                item = self._work.get_nowait()
            except queue.Empty:
                return
            if item is not None:
                item[0].cancel()

    def _run(self) -> None:
        while True:
            item = self._work.get()
            if item is None:
                return
            future, fn, args = item
            if not future.set_running_or_notify_cancel():
                continue
            try:
                result = fn(*args)
            except BaseException as exc:
                future.set_exception(exc)
            else:
                future.set_result(result)
