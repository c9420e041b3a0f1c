"""Per-request and per-job bookkeeping of the scheduler-side connector (no vLLM imports)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kvstore.keys import BlockKey, Tier
from kvstore.transfer.jobs import JobKind

__all__ = ["JobState", "RequestState"]


@dataclass(slots=True)
class RequestState:
    """What the connector tracks for one request between its arrival and its cleanup."""

    req_id: str
    request: Any  # vllm.v1.request.Request: live object, read for block hashes and tokens
    block_ids: list[list[int]] = field(default_factory=list)  # per KV cache group
    num_stored_chunks: int = 0  # chunks [0, n) were considered for storing
    store_jobs: set[int] = field(default_factory=set)
    load_job: int | None = None
    is_sync_load: bool = False  # the planned load runs before the forward of its step
    num_computed_at_lookup: int = 0
    hit_tiers: dict[BlockKey, Tier] = field(default_factory=dict)  # where the last hit was found
    hit_entries: list[tuple[int, int]] = field(default_factory=list)  # (chunk, group) it loads
    load_tokens: dict[Tier, int] = field(default_factory=dict)  # last load, by source tier
    is_engine_hit_recorded: bool = False  # its engine-cached prefix counted as an access
    is_finished: bool = False
    is_waiting_for_stores: bool = False  # request_finished returned True

    @property
    def has_jobs(self) -> bool:
        return bool(self.store_jobs) or self.load_job is not None


@dataclass(slots=True)
class JobState:
    """A transfer job in flight on the workers; settled when every worker has reported it."""

    kind: JobKind
    req_id: str
    keys: tuple[BlockKey, ...]
    num_pending_workers: int
    is_failed: bool = False
    tiers: tuple[Tier, ...] = ()
