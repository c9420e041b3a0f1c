"""An in-memory sink: for tests, and for the connector's `take_events()` path."""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Sequence

from kvstore.events import TierEvent

__all__ = ["MemorySink"]


class MemorySink:
    """Collects events; `take()` swaps them out (thread-safe, any thread).

    Bounded: past `max_events` the oldest are discarded and counted in `num_discarded`.
    """

    def __init__(self, name: str = "memory", *, max_events: int = 100_000) -> None:
        self._name = name
        self._lock = threading.Condition()
        self._events: deque[TierEvent] = deque(maxlen=max_events)
        self._num_received = 0
        self.num_discarded = 0
        self.is_closed = False

    @property
    def name(self) -> str:
        return self._name

    async def start(self) -> None:
        pass

    async def write(self, batch: Sequence[TierEvent]) -> None:
        self.extend(batch)

    async def close(self) -> None:
        with self._lock:
            self.is_closed = True
            self._lock.notify_all()

    def extend(self, events: Sequence[TierEvent]) -> None:
        """Add events directly (what `write` does), from any thread."""
        with self._lock:
            maxlen = self._events.maxlen or 0
            self.num_discarded += max(0, len(self._events) + len(events) - maxlen)
            self._events.extend(events)
            self._num_received += len(events)
            self._lock.notify_all()

    def take(self) -> list[TierEvent]:
        """The events collected since the last `take`, oldest first."""
        with self._lock:
            taken = list(self._events)
            self._events.clear()
        return taken

    def snapshot(self) -> list[TierEvent]:
        with self._lock:
            return list(self._events)

    @property
    def num_received(self) -> int:
        with self._lock:
            return self._num_received

    def wait_for(self, num_events: int, timeout_s: float) -> bool:
        """Block (a thread, never the loop) until `num_events` were received in all."""
        with self._lock:
            return self._lock.wait_for(lambda: self._num_received >= num_events, timeout_s)
