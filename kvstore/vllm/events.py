"""Internal tier events -> vLLM's KV-cache events (for the engine's own publisher)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from vllm.distributed.kv_events import MEDIUM_CPU, MEDIUM_STORAGE, BlockRemoved, BlockStored
from vllm.v1.core.kv_cache_utils import maybe_convert_block_hash

from kvstore.eventbus.wire import LOCALITY_BY_TIER
from kvstore.events import ChunkStored, TierEvent
from kvstore.keys import BlockKey, Tier, split_group_key
from kvstore.vllm.geometry import KVGroup

__all__ = ["MEDIA", "to_vllm_events"]

MEDIA: dict[Tier, str] = {
    Tier.CPU: MEDIUM_CPU,
    Tier.DISK: MEDIUM_STORAGE,
    Tier.REMOTE: MEDIUM_STORAGE,
}


def to_vllm_events(
    events: Sequence[TierEvent], groups: Sequence[KVGroup] = ()
) -> list[BlockStored | BlockRemoved]:
    """BlockStored / BlockRemoved with medium "CPU" or "STORAGE" (locality "REMOTE" for the
    shared remote tier), hashes as vLLM publishes them. A hybrid engine's entries (`groups`:
    its KV cache groups) become one event per group and run of keys, with vLLM's block hash
    (the chunk key) and, on stores, the group's index, kind and sliding window, as vLLM's own
    events for hybrid models carry them."""
    out: list[BlockStored | BlockRemoved] = []
    for event in events:
        medium = MEDIA[Tier(event.tier)]
        locality = LOCALITY_BY_TIER.get(Tier(event.tier))
        for group, first, keys in _group_runs(event.keys, bool(groups)):
            hashes = [maybe_convert_block_hash(key) for key in keys]  # type: ignore[arg-type]
            if not isinstance(event, ChunkStored):
                out.append(BlockRemoved(block_hashes=hashes, medium=medium, locality=locality))
                continue
            parent = event.parent_key if first == 0 else None
            if parent is not None and groups:
                parent = split_group_key(parent)[0]
            size = event.num_tokens_per_chunk
            tokens = event.token_ids[first * size : (first + len(keys)) * size] if (
                event.token_ids) else ()  # fmt: skip
            spec: dict[str, Any] = {}
            if groups:
                spec = {
                    "group_idx": groups[group].index,
                    "kv_cache_spec_kind": groups[group].spec_kind or None,
                    "kv_cache_spec_sliding_window": groups[group].window_tokens or None,
                }
            out.append(
                BlockStored(
                    block_hashes=hashes,
                    parent_block_hash=maybe_convert_block_hash(parent)  # type: ignore[arg-type]
                    if parent is not None
                    else None,
                    token_ids=list(tokens),
                    block_size=size,
                    lora_id=None,
                    medium=medium,
                    lora_name=None,
                    locality=locality,
                    **spec,
                )
            )
    return out


def _group_runs(keys: Sequence[BlockKey], is_hybrid: bool) -> list[tuple[int, int, list[BlockKey]]]:
    """(group, index of the run's first key, chunk keys) for each run of one group's keys."""
    if not is_hybrid:
        return [(0, 0, list(keys))]
    runs: list[tuple[int, int, list[BlockKey]]] = []
    for i, key in enumerate(keys):
        chunk_key, group = split_group_key(key)
        if runs and runs[-1][0] == group:
            runs[-1][2].append(chunk_key)
        else:
            runs.append((group, i, [chunk_key]))
    return runs
