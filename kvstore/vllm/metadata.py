"""What travels between the scheduler-side and worker-side connectors each step."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorMetadata,
    KVConnectorWorkerMetadata,
)

from kvstore.transfer.jobs import CopyJob

__all__ = ["KVStoreConnectorMetadata", "KVStoreWorkerMetadata"]


@dataclass
class KVStoreConnectorMetadata(KVConnectorMetadata):
    """Scheduler -> workers, once per step.

    - `load_jobs`: CPU rows -> engine blocks. Sync ones feed this step's forward and run
      before it; the others complete over the next steps (`is_sync`).
    - `store_jobs`: engine blocks -> CPU rows, for chunks this step's forward completes (copied
      after the forward, in `wait_for_save`, within the step's copy budget).
    - `flush_job_ids`: store jobs whose source blocks are about to be reused (preemption): the
      worker waits for them before the step runs.
    - `finished_store_reqs`: finished requests whose blocks vLLM keeps alive until their stores
      complete; the worker reports each as finished sending once its stores are done.
    - `timed_step`: nonzero for a step the scheduler half times (one that computes at least a
      chunk of tokens: the cost of recompute, `load_policy: cost`); the workers echo it back,
      so its time is the step's own even when steps without tokens send nothing back.
    """

    load_jobs: list[CopyJob] = field(default_factory=list)
    store_jobs: list[CopyJob] = field(default_factory=list)
    flush_job_ids: list[int] = field(default_factory=list)
    finished_store_reqs: list[str] = field(default_factory=list)
    timed_step: int = 0


@dataclass
class KVStoreWorkerMetadata(KVConnectorWorkerMetadata):
    """Workers -> scheduler, once per step, summed over TP ranks by `aggregate`.

    `completed[job_id]` counts the workers that finished the job, `failed[job_id]` those that
    failed it; the scheduler settles a job once the counts reach the number of workers.
    `transfer_stats` is `kvstore.metrics` TransferStats as a dict (bytes and durations).
    `audit` counts loaded chunks by `kvstore.transfer.audit.AuditResult` (`audit_loads` on).
    `timed_steps` echoes the `timed_step` of the steps this output covers.
    """

    completed: dict[int, int] = field(default_factory=dict)
    failed: dict[int, int] = field(default_factory=dict)
    transfer_stats: list[dict[str, Any]] = field(default_factory=list)
    layout: dict[str, Any] | None = None  # rank 0's chunk layout, sent once
    audit: dict[str, int] = field(default_factory=dict)
    timed_steps: list[int] = field(default_factory=list)

    def aggregate(self, other: KVConnectorWorkerMetadata) -> KVConnectorWorkerMetadata:
        if not isinstance(other, KVStoreWorkerMetadata):
            raise TypeError(f"cannot aggregate KVStoreWorkerMetadata with {type(other).__name__}")
        completed = dict(self.completed)
        for job_id, n in other.completed.items():
            completed[job_id] = completed.get(job_id, 0) + n
        failed = dict(self.failed)
        for job_id, n in other.failed.items():
            failed[job_id] = failed.get(job_id, 0) + n
        return KVStoreWorkerMetadata(
            completed=completed,
            failed=failed,
            transfer_stats=self.transfer_stats + other.transfer_stats,
            layout=self.layout if self.layout is not None else other.layout,
            audit={k: self.audit.get(k, 0) + other.audit.get(k, 0)
                   for k in self.audit.keys() | other.audit.keys()},
            timed_steps=sorted(set(self.timed_steps) | set(other.timed_steps)),
        )  # fmt: skip

    def has_data(self) -> bool:
        return bool(
            self.completed or self.failed or self.transfer_stats or self.layout or self.audit
            or self.timed_steps
        )  # fmt: skip
