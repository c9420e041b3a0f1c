"""The scheduler-side half of KVStoreConnector: the brain, in vLLM's EngineCore process.

It answers vLLM's lookups from the index (CPU or disk), plans store and load jobs for the
workers, settles them when the workers report back, and hands disk I/O to the tier service.
Every method runs on vLLM's scheduler thread and returns without waiting on I/O: the service's
results are applied at the next entry (`_apply_completions`), so the index stays single-threaded.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from vllm.v1.metrics.cache_hit_source import CacheHitSource

from kvstore.index import TierIndex
from kvstore.keys import BlockKey, Tier, short_hex
from kvstore.metrics import TransferStats
from kvstore.service import PromotionDone, TierService, WriteDone
from kvstore.transfer.jobs import ChunkSegment, CopyJob, JobKind
from kvstore.vllm.events import to_vllm_events
from kvstore.vllm.geometry import EngineGeometry
from kvstore.vllm.metadata import KVStoreConnectorMetadata, KVStoreWorkerMetadata
from kvstore.vllm.requests import JobState, RequestState
from kvstore.vllm.vllm_metrics import StepCounters

if TYPE_CHECKING:
    from vllm.distributed.kv_events import KVCacheEvent
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.outputs import KVConnectorOutput
    from vllm.v1.request import Request

    from kvstore.metrics import KVStoreMetrics

__all__ = ["ConnectorScheduler"]

logger = logging.getLogger(__name__)


class ConnectorScheduler:
    """Scheduler-side logic; the runtime (index, service, metrics) is built by the caller."""

    def __init__(
        self,
        geometry: EngineGeometry,
        index: TierIndex,
        service: TierService,
        metrics: KVStoreMetrics | None,
        *,
        num_workers: int,
        sync_load_budget_bytes: int = 0,
        on_layout: Any = None,
    ) -> None:
        self._geo = geometry
        self._index = index
        self._service = service
        self._metrics = metrics
        self._num_workers = num_workers
        self._sync_load_budget_bytes = sync_load_budget_bytes
        self._sync_load_bytes = 0  # promised to this step's sync loads so far
        self._on_layout = on_layout
        self._reqs: dict[str, RequestState] = {}
        self._jobs: dict[int, JobState] = {}
        self._job_ids = itertools.count(1)
        self._pending_loads: list[CopyJob] = []
        self._pending_finished: list[str] = []
        self._promotion_owner: dict[BlockKey, str] = {}
        self._events: list[Any] = []
        self.step_counters = StepCounters()  # deltas for vLLM's own /metrics

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

    def track(self, request: Request) -> None:
        """Start tracking a request vLLM just added (its chunks are stored even when vLLM
        never asks kvstore for a hit, e.g. `skip_reading_prefix_cache`)."""
        self._state(request)

    def _state(self, request: Request) -> RequestState:
        state = self._reqs.get(request.request_id)
        if state is None:
            state = RequestState(request.request_id, request)
            self._reqs[request.request_id] = state
        return state

    # -- lookups ----------------------------------------------------------------------------

    def get_num_new_matched_tokens(
        self, request: Request, num_computed_tokens: int
    ) -> tuple[int | None, bool]:
        self._apply_completions()
        state = self._state(request)
        if state.promoting or state.load_job is not None:
            return None, False  # a promotion (or an earlier load) is still in flight
        # vLLM may ask again (a deferral, or no free blocks last time): start from a clean
        # slate, or the holds of the previous answer would be taken twice.
        self._release_holds(state)
        chunk_tokens = self._geo.num_tokens_per_chunk
        # The last prompt token is always computed by the engine (it yields the first logits).
        max_chunks = (request.num_tokens - 1) // chunk_tokens
        start = num_computed_tokens // chunk_tokens
        wanted = self.chunk_keys(request, start, max_chunks)
        if not wanted:
            return 0, False
        result = self._index.lookup(wanted)
        num_hits = result.num_hits
        if any(key in self._promotion_owner for key in result.keys):
            return None, False  # another request is promoting part of this prefix: wait
        if result.num_disk_hits:
            plan = self._index.plan_promotion(list(result.keys))
            state.held.update(plan.held)
            if plan.keys and self._service.submit_promotion(list(plan.items())):
                state.promoting.update(plan.keys)
                state.from_disk.update(plan.keys)
                for key in plan.keys:
                    self._promotion_owner[key] = state.req_id
                self._pump_events()
                return None, False  # ask again once the chunks are in CPU
            if plan.keys:
                self._index.complete_promotion(plan.keys, False)
            num_hits = _leading_cpu_hits(result.tiers)
        num_hit_tokens = (start + num_hits) * chunk_tokens - num_computed_tokens
        skip_tokens = num_computed_tokens - start * chunk_tokens
        self._record_lookup(state, wanted, skip_tokens, num_hits)
        self._pump_events()
        if num_hit_tokens <= 0:
            self._release_holds(state)
            return 0, False
        state.num_computed_at_lookup = num_computed_tokens
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

    def _record_lookup(
        self, state: RequestState, keys: Sequence[BlockKey], skip_tokens: int, num_hits: int
    ) -> None:
        """Count one lookup (once per request) in tokens the engine did not already have:
        `skip_tokens` of the first chunk are computed locally."""
        if self._metrics is None or state.is_lookup_recorded:
            return
        state.is_lookup_recorded = True
        chunk_tokens = self._geo.num_tokens_per_chunk
        hits: dict[Tier, list[int]] = {Tier.CPU: [0, 0], Tier.DISK: [0, 0]}
        for i, key in enumerate(keys[:num_hits]):
            tier = Tier.DISK if key in state.from_disk else Tier.CPU
            hits[tier][0] += 1
            hits[tier][1] += chunk_tokens - (skip_tokens if i == 0 else 0)
        self.step_counters.add("lookup_tokens", len(keys) * chunk_tokens - skip_tokens)
        for tier, (_, tokens) in hits.items():
            self.step_counters.add(f"hit_tokens/{tier.value}", tokens)
        self._metrics.record_lookup(
            len(keys),
            len(keys) * chunk_tokens - skip_tokens,
            {tier: (chunks, tokens) for tier, (chunks, tokens) in hits.items()},
        )

    def update_state_after_alloc(
        self, request: Request, blocks: KVCacheBlocks, num_external_tokens: int
    ) -> None:
        state = self._state(request)
        if num_external_tokens == 0:
            self._release_holds(state)
            return
        geo = self._geo
        block_ids = list(blocks.get_block_ids()[0])
        num_computed = state.num_computed_at_lookup
        first_chunk = num_computed // geo.num_tokens_per_chunk
        end_chunk = (num_computed + num_external_tokens) // geo.num_tokens_per_chunk
        keys = self.chunk_keys(request, first_chunk, end_chunk)
        plan = self._index.prepare_load(keys)
        self._release_holds(state)
        self._service.submit_touch(plan.keys)  # last access and hit count on disk, batched
        rows = dict(plan.items())
        first_block = num_computed // geo.engine_block_size
        segments = []
        state.load_tokens = {}
        for offset, key in enumerate(keys):
            chunk_first = (first_chunk + offset) * geo.blocks_per_chunk
            start = max(chunk_first, first_block)
            segment_blocks = tuple(block_ids[start : chunk_first + geo.blocks_per_chunk])
            segments.append(
                ChunkSegment(rows.get(key, -1), start - chunk_first, segment_blocks, bytes(key))
            )
            tier = Tier.DISK if key in state.from_disk else Tier.CPU
            tokens = len(segment_blocks) * geo.engine_block_size
            state.load_tokens[tier] = state.load_tokens.get(tier, 0) + tokens
        if plan.missing:
            logger.warning(
                "kvstore: %d chunk(s) of request %s vanished before their load; vLLM recomputes",
                len(plan.missing),
                request.request_id,
            )
        job = CopyJob(
            next(self._job_ids),
            JobKind.LOAD,
            request.request_id,
            tuple(segments),
            is_sync=state.is_sync_load,
        )
        self._jobs[job.job_id] = JobState(
            JobKind.LOAD, request.request_id, plan.keys, self._num_workers
        )
        state.load_job = job.job_id
        self._pending_loads.append(job)

    def hit_sources(self, request: Request, num_external_tokens: int) -> dict[CacheHitSource, int]:
        """vLLM's per-source split of the external hit (host memory vs. disk)."""
        state = self._reqs.get(request.request_id)
        if state is None or num_external_tokens == 0:
            return {}
        sources = {
            CacheHitSource.HOST: state.load_tokens.get(Tier.CPU, 0),
            CacheHitSource.DISK: state.load_tokens.get(Tier.DISK, 0),
        }
        return {source: n for source, n in sources.items() if n}

    # -- per step ---------------------------------------------------------------------------

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> KVStoreConnectorMetadata:
        self._apply_completions()
        meta = KVStoreConnectorMetadata(load_jobs=self._pending_loads)
        self._pending_loads = []
        self._sync_load_bytes = 0  # the next schedule() is a new step
        self._update_block_ids(scheduler_output)
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
        meta.finished_store_reqs, self._pending_finished = self._pending_finished, []
        self._pump_events()
        return meta

    def _update_block_ids(self, scheduler_output: SchedulerOutput) -> None:
        for data in scheduler_output.scheduled_new_reqs:
            state = self._reqs.get(data.req_id)
            if state is not None:
                state.block_ids = list(data.block_ids[0])
        cached = scheduler_output.scheduled_cached_reqs
        for req_id, new_block_ids in zip(cached.req_ids, cached.new_block_ids, strict=True):
            state = self._reqs.get(req_id)
            if state is None:
                continue
            if req_id in cached.resumed_req_ids:
                state.block_ids = list(new_block_ids[0]) if new_block_ids else []
            elif new_block_ids:
                state.block_ids.extend(new_block_ids[0])

    def _plan_store(self, state: RequestState, num_scheduled_tokens: int) -> CopyJob | None:
        geo = self._geo
        request = state.request
        num_tokens = request.num_computed_tokens + num_scheduled_tokens
        num_chunks = min(
            num_tokens // geo.num_tokens_per_chunk,
            len(request.block_hashes) // geo.hashes_per_chunk,
            len(state.block_ids) // geo.blocks_per_chunk,
        )
        start = state.num_stored_chunks
        if num_chunks <= start:
            return None  # the common decode step: no chunk completed, nothing built
        state.num_stored_chunks = num_chunks
        keys = self.chunk_keys(request, max(0, start - 1), num_chunks)
        parent = keys[0] if start > 0 else None
        new_keys = keys[1:] if start > 0 else keys
        token_ids = request.all_token_ids[
            start * geo.num_tokens_per_chunk : num_chunks * geo.num_tokens_per_chunk
        ]
        plan = self._index.prepare_store(new_keys, token_ids=list(token_ids), parent_key=parent)
        if plan is None or not plan.keys:
            return None
        chunk_of = {key: start + i for i, key in enumerate(new_keys)}
        segments = []
        for key, row in plan.items():
            first = chunk_of[key] * geo.blocks_per_chunk
            blocks = tuple(state.block_ids[first : first + geo.blocks_per_chunk])
            segments.append(ChunkSegment(row, 0, blocks, bytes(key)))
        job = CopyJob(next(self._job_ids), JobKind.STORE, state.req_id, tuple(segments))
        self._jobs[job.job_id] = JobState(JobKind.STORE, state.req_id, plan.keys, self._num_workers)
        state.store_jobs.add(job.job_id)
        return job

    def update_connector_output(self, output: KVConnectorOutput) -> None:
        meta = output.kv_connector_worker_meta
        if isinstance(meta, KVStoreWorkerMetadata):
            if meta.layout is not None and self._on_layout is not None:
                self._on_layout(meta.layout)
            self._settle_jobs(meta)
        for req_id in output.finished_sending or ():
            state = self._reqs.get(req_id)
            if state is not None and state.is_finished and not state.has_jobs:
                del self._reqs[req_id]
        self._apply_completions()
        self._pump_events()

    def _settle_jobs(self, meta: KVStoreWorkerMetadata) -> None:
        if self._metrics is not None:
            for stats in meta.transfer_stats:
                self._metrics.record_transfer_stats(TransferStats.from_dict(stats))
            if meta.audit:
                self._metrics.record_load_audit(meta.audit)
        for counts, failed in ((meta.completed, False), (meta.failed, True)):
            for job_id, n in counts.items():
                job = self._jobs.get(job_id)
                if job is None:
                    continue
                job.num_pending_workers -= n
                job.is_failed = job.is_failed or failed
                if job.num_pending_workers <= 0:
                    self._finish_job(job_id, job)

    def _finish_job(self, job_id: int, job: JobState) -> None:
        del self._jobs[job_id]
        state = self._reqs.get(job.req_id)
        if job.kind is JobKind.STORE:
            self._index.complete_store(job.keys, not job.is_failed)
            self._write_through()
            if state is not None:
                state.store_jobs.discard(job_id)
        else:
            self._index.complete_load(job.keys)
            if job.is_failed and self._metrics is not None:
                self._metrics.record_load_failure(len(job.keys))
                self.step_counters.add("load_failed_chunks", len(job.keys))
            if state is not None:
                state.load_job = None
        # a request vLLM keeps alive for its stores is cleaned up on finished_sending
        is_done = state is not None and state.is_finished and not state.has_jobs
        if is_done and state is not None and not state.is_waiting_for_stores:
            del self._reqs[job.req_id]

    def _write_through(self) -> None:
        candidates = self._index.take_write_through_candidates()
        if not candidates:
            return
        if not self._service.has_disk:
            return
        plan = self._index.plan_write_through(candidates)
        if not plan.keys and not plan.evicted:
            return
        if not self._service.submit_write(list(plan.items()), list(plan.evicted)):
            self._index.complete_write_through(plan.keys, False)

    def request_finished(self, request: Request) -> tuple[bool, dict[str, Any] | None]:
        state = self._reqs.get(request.request_id)
        if state is None:
            return False, None
        self._release_holds(state)
        state.is_finished = True
        if state.store_jobs:
            state.is_waiting_for_stores = True
            self._pending_finished.append(state.req_id)
            return True, None  # vLLM keeps the blocks until the workers report the stores done
        if state.load_job is None:
            del self._reqs[request.request_id]
        return False, None

    # -- completions from the tier service ----------------------------------------------------

    def _apply_completions(self) -> None:
        for done in self._service.drain_completions():
            if isinstance(done, WriteDone):
                self._index.complete_write_through(done.ok, True)
                self._index.complete_write_through(done.failed, False)
            elif isinstance(done, PromotionDone):
                self._finish_promotion(done)

    def _finish_promotion(self, done: PromotionDone) -> None:
        self._index.complete_promotion(done.ok, True)
        lost = done.failed + done.corrupt + done.missing
        self._index.complete_promotion(lost, False)
        if done.corrupt:
            self._index.discard(done.corrupt, Tier.DISK, "corrupt")
        if done.missing:
            self._index.discard(done.missing, Tier.DISK, "missing")
        for key in done.ok + lost:
            owner = self._promotion_owner.pop(key, None)
            state = self._reqs.get(owner) if owner is not None else None
            if state is None or state.is_finished:
                if key in done.ok:
                    self._index.release([key])
                continue
            state.promoting.discard(key)
            if key in done.ok:
                state.held.add(key)
            else:
                state.from_disk.discard(key)
        for key in lost:
            logger.info(
                "kvstore: promotion of chunk %s failed; it will be recomputed", short_hex(key)
            )

    def _release_holds(self, state: RequestState) -> None:
        if state.held:
            self._index.release(list(state.held))
            state.held.clear()

    # -- events -----------------------------------------------------------------------------

    def _pump_events(self) -> None:
        events = self._index.take_events()
        if not events:
            return
        if self._metrics is not None:
            self._metrics.record_events(events)
        self.step_counters.add_events(events)
        self._service.publish(events)
        self._events.extend(events)

    def take_events(self) -> Iterable[KVCacheEvent]:
        self._pump_events()
        events, self._events = self._events, []
        return to_vllm_events(events)

    # -- state ------------------------------------------------------------------------------

    def settle(self) -> None:
        """Apply finished disk work now (tests and shutdown; vLLM's calls do it otherwise)."""
        self._apply_completions()
        self._write_through()
        self._pump_events()

    def has_pending_work(self) -> bool:
        """Worker jobs in flight, whose results only arrive through engine steps. Disk writes
        and promotions need no steps (the next entry applies them; a request waiting on a
        promotion keeps the engine stepping anyway), so they do not make vLLM spin."""
        return bool(self._jobs)

    @property
    def num_tracked_requests(self) -> int:
        return len(self._reqs)

    @property
    def num_inflight_jobs(self) -> int:
        return len(self._jobs)


def _leading_cpu_hits(tiers: Sequence[Tier]) -> int:
    count = 0
    for tier in tiers:
        if tier is not Tier.CPU:
            break
        count += 1
    return count
