"""Transfer jobs between the engine's KV cache and the CPU region (no vLLM here).

The scheduler decides, the workers execute: a job names engine block ids and CPU rows. A chunk
is `blocks_per_chunk` consecutive engine blocks; its row holds every TP rank's slice of it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

__all__ = ["ChunkSegment", "JobKind", "JobResult", "TransferJob"]


class JobKind(StrEnum):
    STORE = "store"  # engine -> CPU row
    LOAD = "load"  # CPU row -> engine


@dataclass(frozen=True, slots=True)
class ChunkSegment:
    """Engine blocks `block_ids` <-> positions `first_block..first_block+len-1` of chunk `row`.

    `first_block` > 0 only for the first chunk of a load whose leading blocks the engine already
    holds. `row` < 0 marks a chunk the scheduler could not provide: the worker reports its blocks
    as failed so vLLM recomputes them.
    """

    row: int
    first_block: int
    block_ids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class TransferJob:
    job_id: int
    kind: JobKind
    req_id: str
    segments: tuple[ChunkSegment, ...]

    @property
    def block_ids(self) -> list[int]:
        return [b for segment in self.segments for b in segment.block_ids]


@dataclass(frozen=True, slots=True)
class JobResult:
    job_id: int
    kind: JobKind
    req_id: str
    is_ok: bool
    num_bytes: int
    duration_s: float
    failed_block_ids: tuple[int, ...] = field(default=())
    error: str | None = None
