"""Internal events: what a router or a dashboard cares about, per tier.

The index emits them; the tier service fans them out to sinks (vLLM's `take_events()`, a ZMQ PUB
stream in vLLM's wire format, a JSONL log) and to the metrics.

Contract: a key is reported removed from a tier only after it was reported stored in that tier,
and at most once per store.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvstore.keys import BlockKey, Tier

__all__ = ["ChunkRemoved", "ChunkStored", "TierEvent"]


@dataclass(frozen=True, slots=True)
class ChunkStored:
    """Chunks became `ready` in `tier`.

    `keys` are in prefix order. `parent_key` is the key of the chunk before `keys[0]` when known.
    `token_ids` are the tokens the chunks cover (len = len(keys) * num_tokens_per_chunk) when known.
    """

    tier: Tier
    keys: tuple[BlockKey, ...]
    num_tokens_per_chunk: int
    ts_s: float
    parent_key: BlockKey | None = None
    token_ids: tuple[int, ...] | None = None


@dataclass(frozen=True, slots=True)
class ChunkRemoved:
    """Chunks left `tier` (evicted, deleted, or found corrupt)."""

    tier: Tier
    keys: tuple[BlockKey, ...]
    ts_s: float
    reason: str = "evicted"


TierEvent = ChunkStored | ChunkRemoved
