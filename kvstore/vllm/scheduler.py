"""The scheduler-side half of KVStoreConnector, in vLLM's EngineCore process.

It translates vLLM's calls into the pipeline's operations (`kvstore.pipeline.TierPipeline`:
lookups, loads, stores and their completion) and the pipeline's plans into copy jobs for the
workers, which it settles when every worker has reported. The tier rules (promotion, roll-back,
write-through, metrics) live in the pipeline. Every method runs on vLLM's scheduler thread and
returns without waiting on I/O.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from vllm.v1.metrics.cache_hit_source import CacheHitSource

from kvstore.keys import BlockKey, Tier
from kvstore.metrics import TransferStats
from kvstore.pipeline import TierPipeline
from kvstore.transfer.jobs import CopyJob, JobKind
from kvstore.vllm.events import to_vllm_events
from kvstore.vllm.geometry import FULL, EngineGeometry, KVGroup
from kvstore.vllm.hybrid import HybridPlanner
from kvstore.vllm.hybrid_lookup import HybridLookups
from kvstore.vllm.load_plans import load_segments, tokens_by_tier
from kvstore.vllm.metadata import KVStoreConnectorMetadata, KVStoreWorkerMetadata
from kvstore.vllm.request_table import RequestTable
from kvstore.vllm.requests import JobLedger, JobState, RequestState
from kvstore.vllm.step_timing import StepTimer
from kvstore.vllm.store_plans import ChunksByGroup, StorePlans
from kvstore.vllm.vllm_metrics import StepCounters

if TYPE_CHECKING:
    from vllm.distributed.kv_events import KVCacheEvent
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.outputs import KVConnectorOutput
    from vllm.v1.request import Request

    from kvstore.metrics import KVStoreMetrics

__all__ = ["ConnectorScheduler"]

HIT_SOURCES: dict[Tier, CacheHitSource] = {
    Tier.CPU: CacheHitSource.HOST,
    Tier.DISK: CacheHitSource.DISK,
    Tier.REMOTE: CacheHitSource.EXTERNAL_UNSPECIFIED,  # vLLM's bucket for a remote store
}
"""Where vLLM's per-source hit counters put each of kvstore's tiers."""

logger = logging.getLogger(__name__)

_IDLE_WAIT_S = 0.005
"""The most an idle step waits for kvstore's I/O (`build_connector_meta`): an answer ends it."""


class ConnectorScheduler:
    """Scheduler-side logic; the pipeline (index, service, metrics) is built by the caller."""

    def __init__(
        self,
        geometry: EngineGeometry,
        pipeline: TierPipeline,
        metrics: KVStoreMetrics | None,
        *,
        num_workers: int,
        sync_load_budget_bytes: int = 0,
        on_layout: Any = None,
        retention_tokens: int = 0,
    ) -> None:
        self._geo = geometry
        self._planner = HybridPlanner(
            geometry.groups or (KVGroup(0, FULL, 0, geometry.layer_names),),
            geometry.num_tokens_per_chunk,
            retention_tokens // geometry.num_tokens_per_chunk,
        )
        self._hybrid = HybridLookups(self._planner, pipeline) if geometry.is_hybrid else None
        self._stores = StorePlans(geometry, self._planner, pipeline, self.chunk_keys)
        self._pipeline = pipeline
        self._metrics = metrics
        self._sync_load_budget_bytes = sync_load_budget_bytes
        self._sync_load_bytes = 0  # promised to this step's sync loads so far
        self._on_layout = on_layout
        self._reqs = RequestTable()
        self._jobs = JobLedger(num_workers)
        self._pending_loads: list[CopyJob] = []
        self._pending_stores: list[CopyJob] = []  # planned outside a step (request ends)
        self._pending_finished: list[str] = []
        self._timer = StepTimer(geometry.num_tokens_per_chunk, self._observe_step)
        self.step_counters = StepCounters()  # deltas for vLLM's own /metrics
        pipeline.add_observer(self.step_counters)

    # -- keys -------------------------------------------------------------------------------

    def chunk_keys(
        self, request: Request, start: int = 0, stop: int | None = None
    ) -> list[BlockKey]:
        """Keys of the request's full chunks `start..stop-1`: the prefix hash of each chunk's
        last block (only that range is built: this runs on the step path)."""
        step = self._geo.hashes_per_chunk
        hashes = request.block_hashes
        end = len(hashes) // step if stop is None else min(stop, len(hashes) // step)
        return [BlockKey(bytes(hashes[(i + 1) * step - 1])) for i in range(start, end)]

    def _all_groups(self, chunk_keys: list[BlockKey]) -> list[BlockKey]:
        """Every group's key of each chunk (the chunk keys themselves with one group)."""
        if not self._geo.is_hybrid:
            return chunk_keys
        groups = range(self._geo.num_groups)
        return [self._planner.key(key, g) for key in chunk_keys for g in groups]

    def track(self, request: Request) -> None:
        """Start tracking a request vLLM just added (its chunks are stored even when vLLM
        never asks kvstore for a hit, e.g. `skip_reading_prefix_cache`)."""
        self._reqs.state(request)

    # -- lookups ----------------------------------------------------------------------------

    def get_num_new_matched_tokens(
        self, request: Request, num_computed_tokens: int
    ) -> tuple[int | None, bool]:
        state = self._reqs.state(request)
        if state.load_job is not None:
            return None, False  # an earlier load is still in flight
        chunk_tokens = self._geo.num_tokens_per_chunk
        # The last prompt token is always computed by the engine (it yields the first logits).
        max_chunks = (request.num_tokens - 1) // chunk_tokens
        start = num_computed_tokens // chunk_tokens
        if start and not state.is_engine_hit_recorded:
            state.is_engine_hit_recorded = True
            self._pipeline.record_engine_hit(self._all_groups(self.chunk_keys(request, 0, start)))
        skip_tokens = num_computed_tokens - start * chunk_tokens
        if max_chunks <= start:
            return 0, False
        if self._hybrid is not None:
            found = self._hybrid.lookup(
                state.req_id, self.chunk_keys(request, start, max_chunks), start,
                skip_tokens=skip_tokens,
            )  # fmt: skip
            if found.is_pending:
                return None, False
            entries, wanted, tiers = list(found.entries), list(found.keys), found.tiers
        else:
            wanted = self.chunk_keys(request, start, max_chunks)
            entries = [(start + i, 0) for i in range(len(wanted))]
            is_alone = self._reqs.is_alone(state)
            answer = self._pipeline.prepare_lookup(
                state.req_id, wanted, skip_tokens=skip_tokens, is_alone=is_alone
            )
            if answer.is_pending:
                return None, False
            tiers = answer.tiers
        num_hits = len(tiers)
        end_chunk = entries[num_hits - 1][0] + 1 if num_hits else start
        num_hit_tokens = end_chunk * chunk_tokens - num_computed_tokens
        if num_hit_tokens <= 0:
            return 0, False
        state.num_computed_at_lookup = num_computed_tokens
        state.hit_tiers = dict(zip(wanted, tiers, strict=False))
        state.hit_entries = entries[:num_hits]
        state.is_sync_load = self._take_sync_budget(num_hits)
        return num_hit_tokens, not state.is_sync_load

    def _take_sync_budget(self, num_chunks: int) -> bool:
        """Whether a CPU-resident hit of `num_chunks` loads in the step that schedules it
        (before its forward) rather than over the next steps: while this step's sync loads
        stay within `sync_load_budget_bytes`, so one step never stalls for long."""
        num_bytes = num_chunks * self._geo.slice_bytes
        if self._sync_load_bytes + num_bytes > self._sync_load_budget_bytes:
            return False
        self._sync_load_bytes += num_bytes
        return True

    def update_state_after_alloc(
        self, request: Request, blocks: KVCacheBlocks, num_external_tokens: int
    ) -> None:
        state = self._reqs.state(request)
        if num_external_tokens == 0:
            self._pipeline.release(state.req_id)
            return
        geo = self._geo
        block_ids = blocks.get_block_ids()
        num_computed = state.num_computed_at_lookup
        chunk_tokens = geo.num_tokens_per_chunk
        first_chunk = num_computed // chunk_tokens
        end_chunk = (num_computed + num_external_tokens) // chunk_tokens
        chunk_keys = self.chunk_keys(request, first_chunk, end_chunk)  # [i]: first_chunk + i
        entries = [(chunk, g) for chunk, g in state.hit_entries if chunk < end_chunk]
        keys = [self._planner.key(chunk_keys[chunk - first_chunk], g) for chunk, g in entries]
        plan = self._pipeline.prepare_load(state.req_id, keys)
        planned = list(zip(entries, keys, strict=True))
        segments = load_segments(
            self._planner, geo.blocks_per_chunk, block_ids, planned, dict(plan.items()),
            range(first_chunk, end_chunk), num_computed // geo.engine_block_size,
        )  # fmt: skip
        state.load_tokens = tokens_by_tier(
            planned, state.hit_tiers, range(first_chunk, end_chunk), chunk_tokens, num_computed
        )
        job_id = self._jobs.add(JobKind.LOAD, request.request_id, plan.keys)
        job = CopyJob(job_id, JobKind.LOAD, request.request_id, tuple(segments),
                      is_sync=state.is_sync_load)  # fmt: skip
        state.load_job = job_id
        self._pending_loads.append(job)

    def hit_sources(self, request: Request, num_external_tokens: int) -> dict[CacheHitSource, int]:
        """vLLM's per-source split of the external hit; it sums to the hit."""
        state = self._reqs.get(request.request_id)
        if state is None or num_external_tokens == 0:
            return {}
        sources: dict[CacheHitSource, int] = {}
        for tier, tokens in state.load_tokens.items():
            if tokens:
                source = HIT_SOURCES[tier]
                sources[source] = sources.get(source, 0) + tokens
        return sources

    # -- per step ---------------------------------------------------------------------------

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> KVStoreConnectorMetadata:
        # A step with nothing to compute while requests wait on kvstore's I/O: vLLM would loop
        # straight back (an idle step every few ms, which in one process takes the GIL from the
        # I/O threads it waits on); wait briefly for the first answer instead.
        idle = scheduler_output.total_num_scheduled_tokens == 0
        self._pipeline.poll(wait_s=_IDLE_WAIT_S if idle else 0.0)
        timed_step = self._timer.start(scheduler_output.total_num_scheduled_tokens)
        meta = KVStoreConnectorMetadata(load_jobs=self._pending_loads, timed_step=timed_step)
        self._pending_loads = []
        self._sync_load_bytes = 0  # the next schedule() is a new step
        self._reqs.follow_block_ids(scheduler_output)
        for req_id in scheduler_output.preempted_req_ids or ():
            state = self._reqs.get(req_id)
            if state is not None and state.store_jobs:
                meta.flush_job_ids.extend(state.store_jobs)
        for req_id, num_tokens in scheduler_output.num_scheduled_tokens.items():
            state = self._reqs.get(req_id)
            if state is not None and not state.is_finished:
                job = self._plan_store(state, num_tokens)
                if job is not None:
                    meta.store_jobs.append(job)
        meta.store_jobs.extend(self._pending_stores)
        self._pending_stores = []
        meta.finished_store_reqs, self._pending_finished = self._pending_finished, []
        return meta

    def _plan_store(self, state: RequestState, num_scheduled_tokens: int) -> CopyJob | None:
        geo = self._geo
        request = state.request
        num_tokens = request.num_computed_tokens + num_scheduled_tokens
        num_chunks = min(
            num_tokens // geo.num_tokens_per_chunk,
            len(request.block_hashes) // geo.hashes_per_chunk,
            min((len(ids) for ids in state.block_ids), default=0) // geo.blocks_per_chunk,
        )
        start = state.num_stored_chunks
        if num_chunks <= start:
            return None  # the common decode step: no chunk completed, nothing built
        state.num_stored_chunks = num_chunks
        chunks = self._stores.completed(request, state.block_ids, start, num_chunks)
        return self._store_job(state, chunks, state.block_ids)

    def _store_job(
        self, state: RequestState, chunks: ChunksByGroup, block_ids: Sequence[list[int]]
    ) -> CopyJob | None:
        """One copy job for the given chunks of each group (None: nothing to copy, no room,
        or all of them in CPU already)."""
        segments = self._stores.segments(state.request, chunks, block_ids)
        if not segments:
            return None
        is_urgent = any(self._planner.window(segment.group) for segment in segments)
        keys = tuple(BlockKey(segment.key) for segment in segments)
        job_id = self._jobs.add(JobKind.STORE, state.req_id, keys)
        job = CopyJob(job_id, JobKind.STORE, state.req_id, tuple(segments),
                      is_urgent=is_urgent)  # fmt: skip
        state.store_jobs.add(job_id)
        return job

    def _finish_windows(self, state: RequestState, block_ids: Sequence[list[int]]) -> None:
        """A hybrid request ends: its sliding-window groups keep the window before its last
        full chunk (what a conversation's next turn hits). Copied at the next step; vLLM
        keeps the blocks until then (`request_finished` answers True)."""
        chunks = self._stores.end_windows(state.request, block_ids, state.num_stored_chunks)
        job = self._store_job(state, chunks, [list(ids) for ids in block_ids])
        if job is not None:
            self._pending_stores.append(job)

    def update_connector_output(self, output: KVConnectorOutput) -> None:
        meta = output.kv_connector_worker_meta
        self._timer.outputs(meta.timed_steps if isinstance(meta, KVStoreWorkerMetadata) else ())
        if isinstance(meta, KVStoreWorkerMetadata):
            if meta.layout is not None and self._on_layout is not None:
                self._on_layout(meta.layout)
            self._settle_jobs(meta)
        for req_id in output.finished_sending or ():
            state = self._reqs.get(req_id)
            if state is not None and state.is_finished and not state.has_jobs:
                self._reqs.drop(req_id)
        self._pipeline.poll()

    def _observe_step(self, num_tokens: int, duration_s: float) -> None:
        self._pipeline.observe_step(num_tokens, duration_s)

    def _settle_jobs(self, meta: KVStoreWorkerMetadata) -> None:
        if self._metrics is not None:
            for stats in meta.transfer_stats:
                self._metrics.record_transfer_stats(TransferStats.from_dict(stats))
            if meta.audit:
                self._metrics.record_load_audit(meta.audit)
        for job_id, job in self._jobs.settle(meta.completed, meta.failed):
            self._finish_job(job_id, job)

    def _finish_job(self, job_id: int, job: JobState) -> None:
        state = self._reqs.get(job.req_id)
        if job.kind is JobKind.STORE:
            self._pipeline.complete_store(job.keys, ok=not job.is_failed)
            if state is not None:
                state.store_jobs.discard(job_id)
        else:
            self._pipeline.complete_load(job.keys, ok=not job.is_failed)
            if state is not None:
                state.load_job = None
        # a request vLLM keeps alive for its stores is cleaned up on finished_sending
        is_done = state is not None and state.is_finished and not state.has_jobs
        if is_done and state is not None and not state.is_waiting_for_stores:
            self._reqs.drop(job.req_id)

    def request_finished(
        self, request: Request, block_ids: Sequence[list[int]] | None = None
    ) -> tuple[bool, dict[str, Any] | None]:
        """`block_ids`: vLLM's blocks of the request per KV cache group, now (hybrid)."""
        self._pipeline.forget(request.request_id)
        if self._hybrid is not None:
            self._hybrid.forget(request.request_id)
        state = self._reqs.get(request.request_id)
        if state is None:
            return False, None
        state.is_finished = True
        if self._geo.is_hybrid and block_ids is not None:
            self._finish_windows(state, block_ids)
        if state.store_jobs:
            state.is_waiting_for_stores = True
            self._pending_finished.append(state.req_id)
            return True, None  # vLLM keeps the blocks until the workers report the stores done
        if state.load_job is None:
            self._reqs.drop(request.request_id)
        return False, None

    # -- events and state -------------------------------------------------------------------

    def take_events(self) -> Iterable[KVCacheEvent]:
        return to_vllm_events(self._pipeline.take_events(), self._geo.groups)

    def settle(self) -> None:
        """Apply finished disk work now (tests and shutdown; vLLM's calls do it otherwise)."""
        self._pipeline.settle()

    def has_pending_work(self) -> bool:
        """Worker jobs in flight, whose results only arrive through engine steps. Disk writes
        and promotions need no steps (the next entry applies them; a request waiting on a
        promotion keeps the engine stepping anyway), so they do not make vLLM spin."""
        return bool(self._jobs)

    def has_unreleased_requests(self) -> bool:
        """Finished requests whose blocks vLLM still holds until the workers confirm their
        stores (`finished_sending`, one step after `request_finished`, even when the stores
        completed in the step the request finished): vLLM steps on for them by itself
        (`has_finished_requests`); a drain of an idle engine must too."""
        return any(state.is_waiting_for_stores for state in self._reqs)

    @property
    def num_tracked_requests(self) -> int:
        return len(self._reqs)

    @property
    def num_inflight_jobs(self) -> int:
        return len(self._jobs)

    def inflight(self) -> dict[str, int]:
        """What the pipeline holds now (`kvstore_pipeline_inflight`, read at scrape time)."""
        stats = self._pipeline.index.stats()
        return {
            "cpu_pins": stats.cpu.num_pinned,
            "disk_pins": 0 if stats.disk is None else stats.disk.num_pinned,
            "holds": stats.num_holds,
            "promoting": stats.num_promoting,
            "jobs": len(self._jobs),
            "tracked_requests": len(self._reqs),
        }
