"""Which chunks of which KV cache group a hybrid engine stores and needs (no vLLM imports).

With vLLM's hybrid KV cache manager on, a model with sliding-window layers beside full
attention has several KV cache groups, each with its own block table. kvstore keeps each
group's share of a chunk as its own entry (`kvstore.keys.group_key`):
- a full-attention group needs every chunk of a prefix, and stores every chunk;
- a sliding-window group needs, for a hit at chunk boundary `n`, only the chunks within its
  window before `n` (the token computed next attends no further back). It stores those chunks
  for the boundaries a later request is likely to hit: the end of the prompt's full chunks
  (a repeated prompt), every `retention_chunks` chunks (a shared prefix of any length hits at
  the last such boundary inside it), and, when the request ends, the end of its answer (a
  conversation's next turn: `ConnectorScheduler.request_finished`). Every other
  sliding-window chunk is KV no later request reads, and is not stored.
A lookup answers the longest boundary at which every group has what it needs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from kvstore.keys import BlockKey, group_key
from kvstore.vllm.geometry import KVGroup

__all__ = ["NULL_BLOCK_ID", "GroupChunk", "HybridPlanner"]

NULL_BLOCK_ID = 0
"""vLLM's BlockPool reserves block 0 as its null block: a sliding-window group's block table
holds it for positions outside the window (nothing to store there, nothing to load into)."""

GroupChunk = tuple[int, int]
"""(chunk index in the request, KV cache group index)"""


@dataclass(frozen=True, slots=True)
class HybridPlanner:
    groups: tuple[KVGroup, ...]
    chunk_tokens: int
    retention_chunks: int  # sliding-window chunks kept before every multiple of this (0: never)

    def window(self, group: int) -> int:
        """Chunks before a boundary `group` needs; 0: all of them (full attention)."""
        return self.groups[group].window_chunks(self.chunk_tokens)

    def key(self, chunk_key: BlockKey, group: int) -> BlockKey:
        return group_key(chunk_key, group, len(self.groups))

    def is_stored(self, group: int, chunk: int, prompt_boundary: int) -> bool:
        """Whether `group`'s share of chunk `chunk` is worth storing: some boundary a later
        request may hit needs it (module docstring). `prompt_boundary`: the prompt's full
        chunks that a repeat of it can hit (the last prompt token is always computed)."""
        window = self.window(group)
        if window == 0:
            return True
        if prompt_boundary - window <= chunk < prompt_boundary:
            return True
        every = self.retention_chunks
        return every > 0 and (chunk // every + 1) * every - chunk <= window

    def needed(self, boundary: int, start: int) -> list[GroupChunk]:
        """What a hit from chunk `start` (the engine holds chunks before it) up to `boundary`
        needs from kvstore, chunk-major: every group's chunks in `[start, boundary)` that it
        attends from `boundary` on."""
        firsts = [
            start if (window := self.window(g)) == 0 else max(start, boundary - window)
            for g in range(len(self.groups))
        ]
        return [
            (chunk, g)
            for chunk in range(start, boundary)
            for g, first in enumerate(firsts)
            if chunk >= first
        ]

    def longest_hit(self, start: int, stop: int, has: Callable[[int, int], bool]) -> int:
        """The largest boundary `n` in `(start, stop]` at which every group has what it needs
        (`has(chunk, group)`), or `start` when there is none. Full-attention groups bound it
        by their contiguous run; each sliding-window group then by the run of chunks it has
        ending before each boundary (one pass per group: O(chunks x groups) calls of `has`,
        whatever the window)."""
        groups = range(len(self.groups))
        end = start
        full = [g for g in groups if self.window(g) == 0]
        while end < stop and all(has(end, g) for g in full):
            end += 1
        is_served = [True] * (end - start + 1)  # [n - start]: boundary n
        for g in groups:
            window = self.window(g)
            if window == 0:
                continue
            run = 0  # chunks it has, ending at the chunk before the boundary
            for boundary in range(start + 1, end + 1):
                run = run + 1 if has(boundary - 1, g) else 0
                if run < min(window, boundary - start):
                    is_served[boundary - start] = False
        for boundary in range(end, start, -1):
            if is_served[boundary - start]:
                return boundary
        return start

    def tokens_of(self, needed: Sequence[GroupChunk], start: int, boundary: int) -> list[int]:
        """Tokens each needed entry stands for in hit accounting: a chunk's tokens go to its
        first entry (every chunk of `[start, boundary)` has one unless no group is full
        attention; then the first entry takes the chunks before it too)."""
        tokens = [0] * len(needed)
        seen: set[int] = set()
        for i, (chunk, _) in enumerate(needed):
            if chunk not in seen:
                seen.add(chunk)
                tokens[i] = self.chunk_tokens
        if needed:
            tokens[0] += (boundary - start - len(seen)) * self.chunk_tokens
        return tokens
