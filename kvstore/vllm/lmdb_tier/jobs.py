"""`LMDBTier`'s vLLM jobs in flight, and the `JobResult` each one ends with.

The pipeline answers in the tier service's units: writes queued together are merged into one
transaction, so one `WriteDone` may answer several store jobs (matched by key: keys being
stored are distinct, the index never reserves a key twice); each read answers one load job
(matched by its tag, the job id). `TierJobs` maps those answers back onto vLLM's jobs; the
pipeline has already applied them to the tier.

Results carry `transfer_bytes` and `transfer_time` only for the bytes a job really moved: a
job that did no I/O (everything already on disk, nothing fit, refused, bad chunk ids) reports
`transfer_bytes=0`, so vLLM's backpressure detector does not count it as a (fast) store.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Sequence
from dataclasses import dataclass

from vllm.v1.kv_offload.base import OffloadKey
from vllm.v1.kv_offload.tiering.base import JobResult

from kvstore.keys import BlockKey, short_hex
from kvstore.service import PromotionDone, WriteDone

__all__ = ["TierJobs"]

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class _StoreJob:
    """A store job's keys being written, and how they fared so far."""

    num_waiting: int
    num_skipped: int  # new keys that did not fit (the job fails, having written the rest)
    num_written: int = 0
    num_failed: int = 0
    duration_s: float = 0.0


class TierJobs:
    """Store and load jobs in flight and the finished jobs' results.

    Threading: whichever thread `LMDBTier` is called on, under vLLM's lock (never two at once).
    """

    def __init__(self, slot_bytes: int) -> None:
        self._slot_bytes = slot_bytes
        self._stores: dict[int, _StoreJob] = {}
        self._writing: dict[BlockKey, int] = {}  # key being written -> its store job
        self._loads: dict[int, tuple[OffloadKey, ...]] = {}  # job id -> its keys
        self._results: list[JobResult] = []

    @property
    def is_busy(self) -> bool:
        """Whether a job waits for the tier service."""
        return bool(self._stores or self._loads)

    @property
    def has_pending_work(self) -> bool:
        return bool(self._stores or self._loads or self._results)

    def take_results(self) -> list[JobResult]:
        results, self._results = self._results, []
        return results

    def finish_now(self, job_id: int, *, success: bool) -> None:
        """End a job that did no I/O."""
        self._results.append(JobResult(job_id, success=success, transfer_bytes=0))

    def finished(self, done: WriteDone | PromotionDone) -> None:
        """Credit a result of the pipeline to the jobs it answers."""
        if isinstance(done, WriteDone):
            self.writes_done(done)
        else:
            self.load_done(done)

    # -- stores -----------------------------------------------------------------------------

    def start_store(self, job_id: int, keys: Sequence[BlockKey], num_skipped: int) -> None:
        self._stores[job_id] = _StoreJob(num_waiting=len(keys), num_skipped=num_skipped)
        for key in keys:
            self._writing[key] = job_id

    def writes_done(self, done: WriteDone) -> None:
        """Credit a write batch's keys to their jobs; end the jobs it completes."""
        for keys, is_ok in ((done.ok, True), (done.failed, False)):
            for key in keys:
                job_id = self._writing.pop(key, None)
                if job_id is None:
                    logger.warning("LMDBTier: write of chunk %s had no job", short_hex(key))
                    continue
                job = self._stores[job_id]
                job.num_waiting -= 1
                if is_ok:
                    job.num_written += 1
                else:
                    job.num_failed += 1
                job.duration_s = max(job.duration_s, done.duration_s)
                if job.num_waiting == 0:
                    self._results.append(self._store_result(job_id, self._stores.pop(job_id)))

    def _store_result(self, job_id: int, job: _StoreJob) -> JobResult:
        num_bytes = job.num_written * self._slot_bytes
        return JobResult(
            job_id,
            success=job.num_failed == 0 and job.num_skipped == 0,
            transfer_time=job.duration_s if num_bytes else None,
            transfer_bytes=num_bytes,
        )

    # -- loads ------------------------------------------------------------------------------

    def start_load(self, job_id: int, keys: tuple[OffloadKey, ...]) -> None:
        self._loads[job_id] = keys

    def load_done(self, done: PromotionDone) -> None:
        """End the load job `done` answers (by its tag)."""
        job_id = done.tag
        if not isinstance(job_id, int) or job_id not in self._loads:
            logger.warning("LMDBTier: a read finished for unknown job %r", job_id)
            return
        keys = self._loads.pop(job_id)
        loaded = set(done.ok)
        successful = tuple(key for key in keys if BlockKey(key) in loaded)
        is_ok = len(successful) == len(keys)
        self._results.append(
            JobResult(
                job_id,
                success=is_ok,
                successful_keys=None if is_ok or not successful else successful,
                transfer_time=done.duration_s if done.num_bytes else None,
                transfer_bytes=done.num_bytes,
            )
        )

    # -- shutdown ---------------------------------------------------------------------------

    def fail_pending(self) -> Collection[int]:
        """End every job still waiting as failed (the service stopped without answering)."""
        job_ids = [*self._stores, *self._loads]
        self._stores.clear()
        self._writing.clear()
        self._loads.clear()
        for job_id in job_ids:
            self.finish_now(job_id, success=False)
        return job_ids
