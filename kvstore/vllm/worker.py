"""The worker-side half of KVStoreConnector: the hands, in each worker process.

It owns a transfer engine over this rank's KV tensors and the shared CPU region, executes the
jobs the scheduler sends, and reports completions, failures and transfer stats back through
vLLM's worker -> scheduler channel. It decides nothing.

Between `unregister_kv_caches` and `restore_kv_caches` (vLLM >= 0.33 freeing or re-mapping the
KV memory) no copy touches the KV tensors: the engine is closed (CUDA copies in flight are
waited for first), every job not finished is failed - a store's rows are released, a load's
blocks are reported as load errors so vLLM recomputes them - and jobs that arrive meanwhile
fail the same way. `restore_kv_caches` builds a new engine over the same tensors.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from kvstore.config import KVStoreConfig
from kvstore.errors import ConfigError
from kvstore.metrics import Direction, TransferStatsAccumulator
from kvstore.transfer.audit import LoadAudit
from kvstore.transfer.engine import SliceSpec, StepBudget, TransferEngine
from kvstore.transfer.jobs import CopyJob, CopyResult, JobKind
from kvstore.vllm.geometry import EngineGeometry
from kvstore.vllm.metadata import KVStoreConnectorMetadata, KVStoreWorkerMetadata
from tiers.cpu import CPURegion
from tiers.paged import PagedKVView

if TYPE_CHECKING:
    from collections.abc import Mapping

__all__ = ["ConnectorWorker"]

logger = logging.getLogger(__name__)

_DIRECTIONS = {JobKind.STORE: Direction.ENGINE_TO_CPU, JobKind.LOAD: Direction.CPU_TO_ENGINE}


class ConnectorWorker:
    """Worker-side logic. Called only from the worker's model-runner thread."""

    def __init__(self, geometry: EngineGeometry, config: KVStoreConfig, tp_rank: int) -> None:
        self._geo = geometry
        self._config = config
        self._tp_rank = tp_rank
        self._engine: TransferEngine | None = None
        self._views: list[PagedKVView] = []
        self._region: CPURegion | None = None
        self._is_unregistered = False  # vLLM took the KV memory away (restore gives it back)
        self._jobs: dict[int, CopyJob] = {}  # handed to the engine, no result yet
        self._aborted: list[CopyResult] = []  # failed without the engine, reported next
        self._load_reqs: dict[int, str] = {}
        self._req_store_jobs: dict[str, set[int]] = defaultdict(set)
        self._finish_watch: set[str] = set()
        self._load_errors: set[int] = set()
        self._completed: dict[int, int] = {}
        self._timed_steps: list[int] = []  # echoed to the scheduler half (`timed_step`)
        self._failed: dict[int, int] = {}
        self._stats = TransferStatsAccumulator()
        self._audit = LoadAudit() if config.audit_loads else None
        self._layout_pending: dict[str, object] | None = None

    def register_kv_caches(self, kv_caches: Mapping[str, torch.Tensor]) -> None:
        geo = self._geo
        missing = sorted(set(geo.layer_names) - set(kv_caches))
        if missing:
            raise ConfigError(f"kvstore: KV caches for layers {missing} were not registered")
        # one view per KV cache group (a hybrid engine's groups share the KV tensors: a block
        # id belongs to one group, whose layers' views of it hold that group's KV)
        views = [
            PagedKVView({name: kv_caches[name] for name in geo.group_layer_names(group)},
                        geo.num_engine_blocks)
            for group in range(geo.num_groups)
        ]  # fmt: skip
        expected = geo.slice_bytes // geo.blocks_per_chunk
        for view in views:
            if view.block_bytes != expected:
                raise ConfigError(
                    f"kvstore: the engine's KV tensors hold {view.block_bytes} bytes per block, "
                    f"the KV cache spec says {expected}; this attention layout is not supported"
                )
        self._views = views
        self._engine = self._new_engine(views)
        if self._tp_rank == 0:
            self._layout_pending = views[0].chunk_layout(geo.blocks_per_chunk).to_dict()
        logger.debug(  # the scheduler's start-up line is the one the user reads
            "kvstore worker rank %d: %d layers in %d group(s), %d bytes per chunk slice on %s",
            self._tp_rank, len(geo.layer_names), len(views), geo.slice_bytes, views[0].device,
        )  # fmt: skip

    def _new_engine(self, views: Sequence[PagedKVView]) -> TransferEngine:
        slice_bytes = self._geo.slice_bytes
        return TransferEngine(
            views,
            self._attach_region,
            SliceSpec(offset_bytes=self._tp_rank * slice_bytes, size_bytes=slice_bytes),
            device=views[0].device,
            budget=StepBudget(
                load_bytes=self._config.step_copy_budget_bytes,
                store_bytes=self._config.step_copy_budget_bytes,
            ),
            audit=self._audit,
        )

    def _attach_region(self) -> CPURegion:
        # The scheduler creates the region when it starts, which is after the workers have
        # registered their KV caches; the first job arrives after that, so attach lazily
        # (once: an engine built by `restore_kv_caches` shares the mapping).
        if self._region is None:
            self._region = CPURegion.attach(
                self._geo.region_name,
                directory=self._config.region_dir,
                row_bytes=self._geo.row_bytes,
            )
        return self._region

    def unregister_kv_caches(self) -> None:
        """Stop touching the KV tensors: wait for CUDA copies in flight, then fail every job
        without a result (module docstring). Idempotent."""
        if self._is_unregistered:
            return
        self._is_unregistered = True
        engine, self._engine = self._engine, None
        if engine is None:
            return
        finished = engine.poll()  # results already in hand stay what they are
        engine.close()  # drops queued jobs, synchronizes the side stream
        self._aborted.extend(finished)
        done = {result.job_id for result in finished}
        jobs = [job for job_id, job in self._jobs.items() if job_id not in done]
        self._fail_jobs(jobs)
        if jobs:
            logger.warning("kvstore worker rank %d: %d copy job(s) failed: KV caches "
                           "unregistered", self._tp_rank, len(jobs))  # fmt: skip

    def restore_kv_caches(self) -> None:
        """The KV memory is back (same tensors, contents gone): copy again. Idempotent."""
        if not self._is_unregistered:
            return
        self._is_unregistered = False
        if self._views:
            self._engine = self._new_engine(self._views)

    def _fail_jobs(self, jobs: Sequence[CopyJob]) -> None:
        for job in jobs:
            self._aborted.append(
                CopyResult(
                    job_id=job.job_id,
                    kind=job.kind,
                    req_id=job.req_id,
                    is_ok=False,
                    num_bytes=0,
                    duration_s=0.0,
                    failed_block_ids=tuple(job.block_ids) if job.kind is JobKind.LOAD else (),
                    error="KV caches unregistered",
                    is_sync=job.is_sync,
                )
            )

    # -- per step ---------------------------------------------------------------------------

    def handle_preemptions(self, meta: KVStoreConnectorMetadata) -> None:
        if meta.flush_job_ids and self._engine is not None:
            self._engine.flush(meta.flush_job_ids)

    def start_load_kv(self, meta: KVStoreConnectorMetadata) -> None:
        """Before the forward when the step has sync loads (vLLM's `has_sync_kv_loads`), else
        right after it: sync loads complete here; queued ones progress within the budget.
        Every release calls it before it builds the step's worker metadata (`wait_for_save` may
        come a step later, under 0.34's deferred finalize), so a timed step is echoed here."""
        if meta.timed_step:
            self._timed_steps.append(meta.timed_step)
        for job in meta.load_jobs:
            if not job.is_sync:
                self._load_reqs[job.job_id] = job.req_id
        self._submit(meta.load_jobs).run_loads(meta.load_jobs)

    def wait_for_save(self, meta: KVStoreConnectorMetadata) -> None:
        """After the forward (every step, also steps without one): copy the chunks it
        completed, and whatever earlier stores are still queued, within the budget."""
        for job in meta.store_jobs:
            self._req_store_jobs[job.req_id].add(job.job_id)
        self._submit(meta.store_jobs).run_stores(meta.store_jobs)
        self._finish_watch.update(meta.finished_store_reqs)

    def _submit(self, jobs: Sequence[CopyJob]) -> TransferEngine | _NoEngine:
        """The engine that runs `jobs` (now tracked until their result); while the KV caches
        are unregistered, none: the jobs fail at once."""
        if self._is_unregistered:
            self._fail_jobs(jobs)
            return _NoEngine()
        if self._engine is not None:
            self._jobs.update((job.job_id, job) for job in jobs)
            return self._engine
        if jobs:
            raise RuntimeError("kvstore: register_kv_caches was not called before a transfer")
        return _NoEngine()

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str], set[str]]:
        finished_recving: set[str] = set()
        results, self._aborted = self._aborted, []
        if self._engine is not None:
            results += self._engine.poll()
        for result in results:
            req_id = self._on_result(result)
            if req_id is not None:
                finished_recving.add(req_id)
        finished_sending = {r for r in self._finish_watch if not self._req_store_jobs.get(r)}
        self._finish_watch -= finished_sending
        for req_id in finished_sending:
            self._req_store_jobs.pop(req_id, None)
        return finished_sending, finished_recving

    def _on_result(self, result: CopyResult) -> str | None:
        """Book a finished job; returns the request id of a finished asynchronous load."""
        self._jobs.pop(result.job_id, None)
        counts = self._completed if result.is_ok else self._failed
        counts[result.job_id] = counts.get(result.job_id, 0) + 1
        self._stats.observe(_DIRECTIONS[result.kind], result.num_bytes, result.duration_s,
                            result.is_ok)  # fmt: skip
        if result.kind is JobKind.LOAD:
            self._load_errors.update(result.failed_block_ids)
            return self._load_reqs.pop(result.job_id, None)  # sync loads are not "received"
        jobs = self._req_store_jobs.get(result.req_id)
        if jobs is not None:
            jobs.discard(result.job_id)
        return None

    def get_block_ids_with_load_errors(self) -> set[int]:
        errors, self._load_errors = self._load_errors, set()
        return errors

    def build_connector_worker_meta(self) -> KVStoreWorkerMetadata | None:
        stats = self._stats.take()
        audit = self._audit.take_counts() if self._audit is not None else None
        meta = KVStoreWorkerMetadata(
            completed=self._completed,
            failed=self._failed,
            transfer_stats=[] if stats.is_empty else [stats.to_dict()],
            layout=self._layout_pending,
            audit={} if audit is None or audit.is_empty else audit.to_dict(),
            timed_steps=self._timed_steps,
        )
        if not meta.has_data():
            return None
        self._completed, self._failed, self._layout_pending = {}, {}, None
        self._timed_steps = []
        return meta

    def shutdown(self) -> None:
        if self._engine is not None:
            self._engine.close()
        if self._region is not None:
            self._region.close()
            self._region = None


class _NoEngine:
    """Before `register_kv_caches` (vLLM's dummy steps): nothing queued, nothing to run."""

    def run_loads(self, jobs: Sequence[CopyJob]) -> None:
        return

    def run_stores(self, jobs: Sequence[CopyJob]) -> None:
        return
