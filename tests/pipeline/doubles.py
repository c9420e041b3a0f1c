"""Test doubles shared by the pipeline's tests."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from kvstore.events import TierEvent
from kvstore.keys import Tier

__all__ = ["Observer"]


@dataclass
class Observer:
    """Records what a pipeline reports (a `PipelineObserver`)."""

    lookups: list[tuple[int, int, dict[Tier, tuple[int, int]]]] = field(default_factory=list)
    load_failures: list[int] = field(default_factory=list)
    events: list[TierEvent] = field(default_factory=list)

    def record_lookup(
        self, num_chunks: int, num_tokens: int, hits_by_tier: Mapping[Tier, tuple[int, int]]
    ) -> None:
        self.lookups.append((num_chunks, num_tokens, dict(hits_by_tier)))

    def record_load_failure(self, num_chunks: int) -> None:
        self.load_failures.append(num_chunks)

    def record_events(self, events: Sequence[TierEvent]) -> None:
        self.events.extend(events)
