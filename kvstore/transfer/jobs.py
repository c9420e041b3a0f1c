"""Copy jobs between the engine's KV cache and the CPU region (no vLLM here).

The scheduler decides, the workers execute: a job names engine block ids and CPU rows. A chunk
is `blocks_per_chunk` consecutive engine blocks; its row holds every TP rank's slice of it.
(Named `CopyJob`/`CopyResult`, not vLLM's `TransferJob`/`JobResult`, which mean other things.)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

__all__ = ["ChunkSegment", "CopyJob", "CopyResult", "JobKind"]


class JobKind(StrEnum):
    STORE = "store"  # engine -> CPU row
    LOAD = "load"  # CPU row -> engine


@dataclass(frozen=True, slots=True)
class ChunkSegment:
    """Engine blocks `block_ids` <-> positions `first_block..first_block+len-1` of chunk `row`.

    `first_block` > 0 only for the first chunk of a load whose leading blocks the engine already
    holds. `row` < 0 marks a chunk the scheduler could not provide: the worker reports its blocks
    as failed so vLLM recomputes them. `key` is the chunk's key (the load audit uses it).
    `group` is the KV cache group whose layers the blocks belong to (a hybrid engine's row
    holds one group's share of a chunk; 0 otherwise).
    """

    row: int
    first_block: int
    block_ids: tuple[int, ...]
    key: bytes = b""
    group: int = 0


@dataclass(frozen=True, slots=True)
class CopyJob:
    """One batch of chunk copies for one request.

    `is_sync`: a load the request's forward in this very step reads (vLLM was told
    `load_kv_async=False`): it runs before the forward and is not reported as finished
    receiving. Other loads complete across steps and are reported through `get_finished`.
    `is_urgent`: a store whose source blocks vLLM may reuse from the next step on (a
    sliding-window group's blocks leave the window): it is copied before the next forward.
    """

    job_id: int
    kind: JobKind
    req_id: str
    segments: tuple[ChunkSegment, ...]
    is_sync: bool = False
    is_urgent: bool = False

    @property
    def block_ids(self) -> list[int]:
        return [b for segment in self.segments for b in segment.block_ids]


@dataclass(frozen=True, slots=True)
class CopyResult:
    job_id: int
    kind: JobKind
    req_id: str
    is_ok: bool
    num_bytes: int
    duration_s: float
    failed_block_ids: tuple[int, ...] = field(default=())
    error: str | None = None
    is_sync: bool = False
