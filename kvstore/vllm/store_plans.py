"""Which chunks of a request the scheduler half copies to the CPU tier, group by group, and the
rows the pipeline reserves for them (no vLLM imports; `ConnectorScheduler` makes the jobs).

A chunk completed by a step is stored in every group that keeps it (`HybridPlanner.is_stored`:
full attention always, a sliding-window group only within the windows later hits read) and
whose blocks are all real (a sliding-window group's table holds vLLM's null block outside its
window). When a hybrid request ends, its sliding-window groups also keep the window before
its last full chunk, from the blocks vLLM still holds for it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from kvstore.keys import BlockKey
from kvstore.pipeline import TierPipeline
from kvstore.transfer.jobs import ChunkSegment
from kvstore.vllm.geometry import EngineGeometry
from kvstore.vllm.hybrid import NULL_BLOCK_ID, HybridPlanner

__all__ = ["ChunksByGroup", "StorePlans"]

ChunksByGroup = dict[int, list[int]]
"""KV cache group -> sorted chunk indexes."""

ChunkKeys = Callable[[Any, int, int], list[BlockKey]]
"""(request, start, stop) -> the chunk keys of chunks start..stop-1."""


class StorePlans:
    def __init__(
        self,
        geometry: EngineGeometry,
        planner: HybridPlanner,
        pipeline: TierPipeline,
        chunk_keys: ChunkKeys,
    ) -> None:
        self._geo = geometry
        self._planner = planner
        self._pipeline = pipeline
        self._chunk_keys = chunk_keys

    def completed(
        self, request: Any, block_ids: Sequence[list[int]], start: int, stop: int
    ) -> ChunksByGroup:
        """Chunks `start..stop-1`, just completed, that each group keeps."""
        prompt_boundary = self._prompt_boundary(request)
        planner = self._planner
        return {
            g: [
                chunk
                for chunk in range(start, stop)
                if planner.is_stored(g, chunk, prompt_boundary)
                and not (planner.window(g) and self._has_null(ids, chunk))
            ]
            for g, ids in enumerate(block_ids)
        }

    def end_windows(
        self, request: Any, block_ids: Sequence[list[int]], boundary: int
    ) -> ChunksByGroup:
        """A request ends with `boundary` full chunks computed: the chunks of each
        sliding-window group's window before it that were not kept as they completed
        (`block_ids`: vLLM's blocks now, null outside each window)."""
        geo = self._geo
        prompt_boundary = self._prompt_boundary(request)
        if boundary <= prompt_boundary or len(block_ids) != geo.num_groups:
            return {}  # nothing computed past the prompt's own windows
        chunks: ChunksByGroup = {}
        for g, ids in enumerate(block_ids):
            window = self._planner.window(g)
            if window == 0:
                continue
            chunks[g] = [
                chunk
                for chunk in range(max(0, boundary - window), boundary)
                if not self._planner.is_stored(g, chunk, prompt_boundary)
                and len(ids) >= (chunk + 1) * geo.blocks_per_chunk
                and not self._has_null(ids, chunk)
            ]
        return chunks

    def segments(
        self, request: Any, chunks: ChunksByGroup, block_ids: Sequence[list[int]]
    ) -> list[ChunkSegment]:
        """Rows reserved for `chunks` and the copies into them (possibly fewer: the CPU tier
        may have no room for all, or hold some already)."""
        flat = [c for group_chunks in chunks.values() for c in group_chunks]
        if not flat:
            return []
        base = max(0, min(flat) - 1)  # the chunk before the first is its parent
        keys = self._chunk_keys(request, base, max(flat) + 1)  # [i]: chunk base + i
        return [
            segment
            for g, group_chunks in chunks.items()
            for run in _runs(group_chunks)
            for segment in self._run_segments(request, keys, base, run, g, block_ids[g])
        ]

    def _run_segments(
        self,
        request: Any,
        chunk_keys: list[BlockKey],
        base: int,
        chunks: range,
        group: int,
        block_ids: list[int],
    ) -> list[ChunkSegment]:
        """One group's consecutive chunks: one reservation."""
        geo = self._geo
        planner = self._planner
        keys = [planner.key(chunk_keys[chunk - base], group) for chunk in chunks]
        parent = (
            planner.key(chunk_keys[chunks.start - 1 - base], group) if chunks.start > base else None
        )
        token_ids = request.all_token_ids[
            chunks.start * geo.num_tokens_per_chunk : chunks.stop * geo.num_tokens_per_chunk
        ]
        plan = self._pipeline.prepare_store(keys, token_ids=list(token_ids), parent_key=parent)
        if plan is None:
            return []
        chunk_of = dict(zip(keys, chunks, strict=True))
        segments = []
        for key, row in plan.items():
            first = chunk_of[key] * geo.blocks_per_chunk
            blocks = tuple(block_ids[first : first + geo.blocks_per_chunk])
            segments.append(ChunkSegment(row, 0, blocks, bytes(key), group))
        return segments

    def _prompt_boundary(self, request: Any) -> int:
        """The prompt's full chunks a repeat of it can hit (its last token is recomputed)."""
        return int((request.num_prompt_tokens - 1) // self._geo.num_tokens_per_chunk)

    def _has_null(self, block_ids: Sequence[int], chunk: int) -> bool:
        """Whether a chunk's blocks include vLLM's null block (a sliding-window group's
        position outside its window: nothing there to copy)."""
        per_chunk = self._geo.blocks_per_chunk
        return NULL_BLOCK_ID in block_ids[chunk * per_chunk : (chunk + 1) * per_chunk]


def _runs(chunks: list[int]) -> list[range]:
    """Consecutive runs of sorted chunk indexes."""
    runs: list[range] = []
    for chunk in chunks:
        if runs and runs[-1].stop == chunk:
            runs[-1] = range(runs[-1].start, chunk + 1)
        else:
            runs.append(range(chunk, chunk + 1))
    return runs
