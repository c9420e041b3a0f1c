"""Per-request and per-job bookkeeping of the scheduler-side connector (no vLLM imports)."""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kvstore.keys import BlockKey, Tier
from kvstore.transfer.jobs import JobKind

__all__ = ["JobLedger", "JobState", "RequestState"]


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


class JobLedger:
    """The transfer jobs in flight on the workers, by id (ids count from 1)."""

    def __init__(self, num_workers: int) -> None:
        self._num_workers = num_workers
        self._jobs: dict[int, JobState] = {}
        self._ids = itertools.count(1)

    def add(self, kind: JobKind, req_id: str, keys: tuple[BlockKey, ...]) -> int:
        """Track a new job that every worker will report; its id."""
        job_id = next(self._ids)
        self._jobs[job_id] = JobState(kind, req_id, keys, self._num_workers)
        return job_id

    def settle(
        self, completed: Mapping[int, int], failed: Mapping[int, int]
    ) -> list[tuple[int, JobState]]:
        """Count the workers' reports (job id -> reports); the jobs every worker has now
        reported, no longer tracked (failed if any worker failed it)."""
        settled: list[tuple[int, JobState]] = []
        for counts, is_failed in ((completed, False), (failed, True)):
            for job_id, n in counts.items():
                job = self._jobs.get(job_id)
                if job is None:
                    continue
                job.num_pending_workers -= n
                job.is_failed = job.is_failed or is_failed
                if job.num_pending_workers <= 0:
                    del self._jobs[job_id]
                    settled.append((job_id, job))
        return settled

    def __len__(self) -> int:
        return len(self._jobs)
