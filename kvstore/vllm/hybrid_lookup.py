"""A hybrid engine's lookups through the pipeline, across the scheduler's calls (no vLLM).

A hybrid hit is a chunk boundary at which every KV cache group has what it needs
(`kvstore.vllm.hybrid`), so a lookup first picks the boundary, then asks the pipeline for
exactly that boundary's entries (promoting disk-only ones, fetching remote ones), which answers
"pending" until they are in CPU. A part of a boundary's entries is no hit at all.

The boundary: the longest one the CPU and disk tiers serve (the index answers without I/O).
With a remote tier, and that boundary short of the request's end, the remote tier may hold
more: the boundaries other replicas stored windows for, the request's own end (a repeated
prompt) and the last retained boundary before it (a shared prefix), are tried first, each
whole or not at all, and the local boundary last. The remote tier's own rules (its probe, the
load cost model's decisions and its wait budget, which weigh the tokens a remote hit adds to
the local one) apply to each.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from kvstore.index.table import READY
from kvstore.keys import BlockKey, Tier
from kvstore.pipeline import TierPipeline
from kvstore.vllm.hybrid import GroupChunk, HybridPlanner

__all__ = ["HybridAnswer", "HybridLookups"]


@dataclass(frozen=True, slots=True)
class HybridAnswer:
    """`is_pending`: ask again. Otherwise the hit's entries (none: no hit), their keys and the
    tier each was found in."""

    is_pending: bool = False
    entries: tuple[GroupChunk, ...] = ()
    keys: tuple[BlockKey, ...] = ()
    tiers: tuple[Tier, ...] = ()


_PENDING = HybridAnswer(is_pending=True)


@dataclass(slots=True)
class _Targets:
    """One request's boundaries still to try (the first is being tried)."""

    start: int
    local: int
    boundaries: list[int] = field(default_factory=list)


class HybridLookups:
    def __init__(self, planner: HybridPlanner, pipeline: TierPipeline) -> None:
        self._planner = planner
        self._pipeline = pipeline
        self._targets: dict[str, _Targets] = {}

    def lookup(
        self, owner: str, keys: Sequence[BlockKey], start: int, *, skip_tokens: int = 0
    ) -> HybridAnswer:
        """`keys[i]`: the chunk key of chunk `start + i`, up to the last chunk a hit may
        reach; the engine holds chunks before `start`."""
        stop = start + len(keys)
        targets = self._targets.get(owner)
        if targets is None or targets.start != start:
            targets = self._plan(start, stop, keys)
            self._targets[owner] = targets
        planner = self._planner
        while targets.boundaries:
            boundary = targets.boundaries[0]
            entries = planner.needed(boundary, start)
            if not entries:  # no hit: counted as a lookup all the same
                self._pipeline.prepare_lookup(
                    owner, [], skip_tokens=skip_tokens, num_asked_chunks=stop - start
                )
                break
            wanted = [planner.key(keys[chunk - start], g) for chunk, g in entries]
            is_local = len(targets.boundaries) == 1
            gain = (boundary - targets.local) * planner.chunk_tokens  # over the local hit
            answer = self._pipeline.prepare_lookup(
                owner,
                wanted,
                skip_tokens=skip_tokens,
                token_counts=planner.tokens_of(entries, start, boundary),
                num_asked_chunks=stop - start,
                remote_tokens=None if is_local else gain,
                is_final=is_local,
            )
            if answer.is_pending:
                return _PENDING
            if answer.num_hits == len(wanted):
                del self._targets[owner]
                return HybridAnswer(False, tuple(entries), tuple(wanted), answer.tiers)
            self._pipeline.release(owner)  # a part of a boundary is no hit: the next one
            targets.boundaries.pop(0)
            if len(targets.boundaries) == 1:  # the local one, as it stands now
                targets.boundaries = [self._local_boundary(start, stop, keys)]
        self._targets.pop(owner, None)
        return HybridAnswer()

    def forget(self, owner: str) -> None:
        self._targets.pop(owner, None)

    def _plan(self, start: int, stop: int, keys: Sequence[BlockKey]) -> _Targets:
        local = self._local_boundary(start, stop, keys)
        boundaries = [local]
        if self._pipeline.has_remote and local < stop:
            every = self._planner.retention_chunks
            retained = (stop - 1) // every * every if every else 0
            boundaries = [stop, *([retained] if local < retained < stop else []), local]
        return _Targets(start, local, boundaries)

    def _local_boundary(self, start: int, stop: int, keys: Sequence[BlockKey]) -> int:
        """The longest boundary every group's entries in CPU or on disk serve."""
        index = self._pipeline.index
        planner = self._planner

        def has(chunk: int, group: int) -> bool:
            key = planner.key(keys[chunk - start], group)
            return READY in (index.state_of(Tier.CPU, key), index.state_of(Tier.DISK, key))

        return planner.longest_hit(start, stop, has)
