"""What a pipeline reports, and to whom: `PipelineObserver`, and `Observers`, the fan-out both
configurations of the pipeline (`TierPipeline`, `DiskPipeline`) report through.

Rule: every placement event is counted once by every observer, published once to the event
sinks, and kept for the pipeline's owner until it takes them (`take_events`: vLLM's publisher).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

from kvstore.events import TierEvent
from kvstore.keys import Tier

__all__ = ["Observers", "PipelineObserver"]


class PipelineObserver(Protocol):
    """What the pipeline reports (`kvstore.metrics.KVStoreMetrics` is one)."""

    def record_lookup(
        self, num_chunks: int, num_tokens: int, hits_by_tier: Mapping[Tier, tuple[int, int]]
    ) -> None: ...

    def record_load_failure(self, num_chunks: int) -> None: ...

    def record_events(self, events: Sequence[TierEvent]) -> None: ...


class Observers:
    """The observers as one, in order, and the events seen since the owner last took them.
    `publish` hands events to the sinks (the tier service's `publish`)."""

    def __init__(
        self,
        observers: Sequence[PipelineObserver],
        publish: Callable[[Sequence[TierEvent]], None],
    ) -> None:
        self._observers = list(observers)
        self._publish = publish
        self._events: list[TierEvent] = []

    def add(self, observer: PipelineObserver) -> None:
        self._observers.append(observer)

    def record_lookup(
        self, num_chunks: int, num_tokens: int, hits_by_tier: Mapping[Tier, tuple[int, int]]
    ) -> None:
        for observer in self._observers:
            observer.record_lookup(num_chunks, num_tokens, hits_by_tier)

    def record_load_failure(self, num_chunks: int) -> None:
        if num_chunks:
            for observer in self._observers:
                observer.record_load_failure(num_chunks)

    def record_events(self, events: Sequence[TierEvent]) -> None:
        if not events:
            return
        for observer in self._observers:
            observer.record_events(events)
        self._publish(events)
        self._events.extend(events)

    def take_events(self) -> list[TierEvent]:
        events, self._events = self._events, []
        return events
