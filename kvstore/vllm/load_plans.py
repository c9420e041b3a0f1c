"""Which engine blocks a planned load fills (the scheduler half's load jobs; no vLLM imports).

A hit is a list of entries, each one KV cache group's share of a chunk, with the CPU row the
pipeline planned for it (-1: none, the copy fails and vLLM recomputes). Every block vLLM
allocated for the hit is covered: one that no entry fills (not expected: a hybrid lookup covers
every group's window) gets a segment with no row, so it fails instead of being read unfilled.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from kvstore.keys import BlockKey, Tier
from kvstore.transfer.jobs import ChunkSegment
from kvstore.vllm.hybrid import NULL_BLOCK_ID, GroupChunk, HybridPlanner

__all__ = ["load_segments", "tokens_by_tier"]


def load_segments(
    planner: HybridPlanner,
    blocks_per_chunk: int,
    block_ids: Sequence[list[int]],
    entries: Sequence[tuple[GroupChunk, bytes]],
    rows: Mapping[bytes, int],
    chunks: range,
    first_block: int,
) -> list[ChunkSegment]:
    """The segments of a load of `entries` ((chunk, group), key) into `block_ids` (per group)
    from block `first_block` on, covering every group's blocks of `chunks`."""

    def segment(chunk: int, group: int, row: int, key: bytes) -> ChunkSegment | None:
        chunk_first = chunk * blocks_per_chunk
        start = max(chunk_first, first_block)
        ids = block_ids[group][start : chunk_first + blocks_per_chunk]
        num_null = 0
        if planner.window(group):  # full-attention tables hold no null blocks
            num_null = next((i for i, b in enumerate(ids) if b != NULL_BLOCK_ID), len(ids))
        if num_null == len(ids):
            return None  # the group holds only null blocks there (outside its window)
        start += num_null
        return ChunkSegment(row, start - chunk_first, tuple(ids[num_null:]), key, group)

    planned = [segment(c, g, rows.get(key, -1), key) for (c, g), key in entries]
    covered = {entry for entry, _ in entries}
    unfilled = [
        segment(c, g, -1, b"")
        for g in range(len(block_ids))
        for c in chunks
        if (c, g) not in covered
    ]
    return [s for s in (*planned, *unfilled) if s is not None]


def tokens_by_tier(
    planned: Sequence[tuple[tuple[int, int], BlockKey]],
    hit_tiers: Mapping[BlockKey, Tier],
    chunks: range,
    num_tokens_per_chunk: int,
    num_computed: int,
) -> dict[Tier, int]:
    """The tokens a load brings, by the tier its chunks were found in (a chunk counts where its
    first planned entry was; `num_computed` tokens the engine already has are not counted)."""
    first_tier: dict[int, Tier] = {}
    for (chunk, _), key in planned:
        first_tier.setdefault(chunk, hit_tiers.get(key, Tier.CPU))
    tokens: dict[Tier, int] = {}
    for chunk in chunks:
        tier = first_tier.get(chunk, Tier.CPU)
        count = min(num_tokens_per_chunk, (chunk + 1) * num_tokens_per_chunk - num_computed)
        tokens[tier] = tokens.get(tier, 0) + count
    return tokens
