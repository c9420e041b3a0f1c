"""Internal tier events -> vLLM's KV-cache events (for the engine's own publisher)."""

from __future__ import annotations

from collections.abc import Sequence

from vllm.distributed.kv_events import MEDIUM_CPU, MEDIUM_STORAGE, BlockRemoved, BlockStored
from vllm.v1.core.kv_cache_utils import maybe_convert_block_hash

from kvstore.eventbus.wire import LOCALITY_BY_TIER
from kvstore.events import ChunkStored, TierEvent
from kvstore.keys import Tier

__all__ = ["MEDIA", "to_vllm_events"]

MEDIA: dict[Tier, str] = {
    Tier.CPU: MEDIUM_CPU,
    Tier.DISK: MEDIUM_STORAGE,
    Tier.REMOTE: MEDIUM_STORAGE,
}


def to_vllm_events(events: Sequence[TierEvent]) -> list[BlockStored | BlockRemoved]:
    """BlockStored / BlockRemoved with medium "CPU" or "STORAGE" (locality "REMOTE" for the
    shared remote tier), hashes as vLLM publishes them."""
    out: list[BlockStored | BlockRemoved] = []
    for event in events:
        hashes = [maybe_convert_block_hash(key) for key in event.keys]  # type: ignore[arg-type]
        medium = MEDIA[Tier(event.tier)]
        locality = LOCALITY_BY_TIER.get(Tier(event.tier))
        if isinstance(event, ChunkStored):
            parent = event.parent_key
            out.append(
                BlockStored(
                    block_hashes=hashes,
                    parent_block_hash=maybe_convert_block_hash(parent)  # type: ignore[arg-type]
                    if parent is not None
                    else None,
                    token_ids=list(event.token_ids or ()),
                    block_size=event.num_tokens_per_chunk,
                    lora_id=None,
                    medium=medium,
                    lora_name=None,
                    locality=locality,
                )
            )
        else:
            out.append(BlockRemoved(block_hashes=hashes, medium=medium, locality=locality))
    return out
