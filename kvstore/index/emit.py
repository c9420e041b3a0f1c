"""Build the index's events from entries that changed state."""

from __future__ import annotations

from collections.abc import Sequence

from kvstore.events import ChunkRemoved, ChunkStored
from kvstore.index.table import Entry
from kvstore.keys import BlockKey, Tier

__all__ = ["removed_event", "stored_events"]


def stored_events(
    tier: Tier, entries: Sequence[Entry], num_tokens_per_chunk: int, ts_s: float
) -> list[ChunkStored]:
    """One `ChunkStored` per run of entries that chain (each one's parent is the previous key).

    Token ids are attached only when every entry of the run still has them.
    """
    events: list[ChunkStored] = []
    start = 0
    for end in range(1, len(entries) + 1):
        if end < len(entries) and entries[end].parent_key == entries[end - 1].key:
            continue
        run = entries[start:end]
        token_ids: tuple[int, ...] | None = None
        if all(entry.token_ids is not None for entry in run):
            token_ids = tuple(token for entry in run for token in entry.token_ids or ())
        events.append(
            ChunkStored(
                tier=tier,
                keys=tuple(entry.key for entry in run),
                num_tokens_per_chunk=num_tokens_per_chunk,
                ts_s=ts_s,
                parent_key=run[0].parent_key,
                token_ids=token_ids,
            )
        )
        start = end
    return events


def removed_event(tier: Tier, keys: Sequence[BlockKey], ts_s: float, reason: str) -> ChunkRemoved:
    return ChunkRemoved(tier=tier, keys=tuple(keys), ts_s=ts_s, reason=reason)
