"""`EventLog`: the placement events of one owner (the index, the remote steps, LMDBTier).

Each component that changes placement appends here; its owner takes the list once per step and
hands it to every observer (metrics, vLLM's KV-events publisher, kvstore's sinks).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from kvstore.events import ChunkStored, TierEvent
from kvstore.index.emit import removed_event, stored_events
from kvstore.index.table import Entry
from kvstore.keys import BlockKey, Tier

__all__ = ["EventLog"]


class EventLog:
    """The placement events of one owner, oldest first (`take` swaps the list)."""

    def __init__(self, num_tokens_per_chunk: int, clock: Callable[[], float] = time.time) -> None:
        self._num_tokens_per_chunk = num_tokens_per_chunk
        self._clock = clock
        self._events: list[TierEvent] = []

    def stored(self, tier: Tier, entries: Sequence[Entry]) -> None:
        if entries:
            self._events.extend(
                stored_events(tier, entries, self._num_tokens_per_chunk, self._clock())
            )

    def stored_keys(self, tier: Tier, keys: Sequence[BlockKey]) -> None:
        """Chunks became ready in `tier` with no lineage known (e.g. the remote tier)."""
        if keys:
            self._events.append(
                ChunkStored(tier, tuple(keys), self._num_tokens_per_chunk, self._clock())
            )

    def removed(self, tier: Tier, keys: Sequence[BlockKey], reason: str) -> None:
        if keys:
            self._events.append(removed_event(tier, keys, self._clock(), reason))

    def take(self) -> list[TierEvent]:
        events, self._events = self._events, []
        return events
