"""`LMDBTier`: kvstore's LMDB store as a secondary tier of vLLM's own `TieringOffloadingSpec`.

GPU users of vLLM's native offloading (the `OffloadingConnector` with its CPU tier) add a
bounded, persistent, checksummed disk tier that the `kvstore` CLI can inspect:

    "kv_connector_extra_config": {"spec_name": "TieringOffloadingSpec", "cpu_bytes_to_use": ...,
        "secondary_tiers": [{"type": "LMDBTier", "module_path": "kvstore.vllm",
                             "path": "/nvme/kvstore", "capacity_bytes": "100GiB"}]}

vLLM cascades every chunk stored to its CPU tier here (`submit_store`) and promotes disk hits
back into CPU slots (`lookup` → `submit_load`). Pieces: `DiskChunks` (the index: eviction by
bytes, pins, events), `TierIO` (the copies, on background threads), `LMDBTierOptions`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from prometheus_client import CollectorRegistry
from vllm.v1.kv_offload.base import (
    Locality,
    LookupResult,
    Medium,
    OffloadingEvent,
    OffloadKey,
    ReqContext,
    RequestOffloadingContext,
    ScheduleEndContext,
)
from vllm.v1.kv_offload.tiering.base import JobResult, SecondaryTierManager, TransferJob

from kvstore.errors import KVStoreError
from kvstore.events import ChunkRemoved
from kvstore.keys import BlockKey, Tier
from kvstore.metrics import (
    Direction,
    IOOp,
    KVStoreMetrics,
    MetricsServer,
    start_metrics_server,
    store_snapshot,
)
from kvstore.namespace import NamespaceDescriptor, namespace_id
from kvstore.vllm.geometry import _device_type
from kvstore.vllm.lmdb_tier_io import (
    LoadOutcome,
    PrimarySlots,
    StoreOutcome,
    TierIO,
    open_tier_store,
    seeded_chunks,
)
from kvstore.vllm.lmdb_tier_options import LMDBTierOptions, tier_descriptor

if TYPE_CHECKING:
    from vllm.v1.kv_offload.base import OffloadingSpec
    from vllm.v1.kv_offload.tiering.backpressure import BackpressureDetector

__all__ = ["LMDBTier"]

logger = logging.getLogger(__name__)

_TOUCH_FLUSH_INTERVAL_S = 1.0


@dataclass(frozen=True, slots=True)
class _LoadJob:
    keys: tuple[OffloadKey, ...]  # as vLLM gave them
    pinned: tuple[BlockKey, ...]  # being read


class LMDBTier(SecondaryTierManager):
    """A bounded, persistent, checksummed LMDB disk tier behind vLLM's primary CPU tier.

    Threading: vLLM's scheduler thread calls every method; none blocks on I/O except
    `__init__` (opens and scans the store at engine start), `drain_jobs` and `shutdown` (which
    wait by contract). That thread alone owns the index (`DiskChunks`) and the job tables. The
    copies run on `TierIO`'s threads (one LMDB writer, `num_read_threads` readers), which read
    and write only the primary slots vLLM pinned for the job, and post outcomes to a queue that
    `get_finished_jobs` drains. The metrics exporter thread reads plain counters only.

    Failures are results, never exceptions into vLLM: a store that cannot be written (disk
    full, I/O error, no room) finishes unsuccessfully; a chunk that fails its checksum on load
    is left out of `successful_keys`, deleted and counted, and its bytes never reach the slot.
    """

    medium: ClassVar[Medium] = Medium.STORAGE

    def __init__(
        self,
        offloading_spec: OffloadingSpec,
        primary_kv_view: memoryview,
        tier_type: str,
        backpressure_detector: BackpressureDetector | None = None,
        **options: Any,
    ) -> None:
        super().__init__(offloading_spec, primary_kv_view, tier_type, backpressure_detector)
        self.options = opts = LMDBTierOptions.from_options(options)
        self.locality = Locality(opts.locality) if opts.locality is not None else None
        self._slots = PrimarySlots(primary_kv_view)
        self.descriptor: NamespaceDescriptor = tier_descriptor(
            offloading_spec.config,
            self._slots.slot_bytes,
            salt=opts.namespace_salt,
            device_type=_device_type(),
        )
        self.namespace = namespace_id(self.descriptor)
        self._num_tokens_per_chunk = self.descriptor.num_tokens_per_chunk
        self.registry = CollectorRegistry()
        self.metrics = KVStoreMetrics(self.registry)
        is_published = offloading_spec.kv_events_config.enable_kv_cache_events
        self._events: list[OffloadingEvent] | None = (
            [] if opts.enable_kv_events and is_published else None
        )
        self._stores: dict[int, int] = {}  # job id -> new keys that did not fit
        self._loads: dict[int, _LoadJob] = {}
        self._results: list[JobResult] = []  # jobs that finished without I/O
        self._touches: list[BlockKey] = []
        self._last_touch_flush_s = time.monotonic()
        self._is_shut_down = False
        self.store = open_tier_store(opts, self.descriptor, self._slots.slot_bytes)
        try:  # no thread has started yet: closing the store undoes everything
            self._chunks = seeded_chunks(self.store, opts, self.descriptor)
            self._io = TierIO(self.store, self.namespace, self._slots, opts.num_read_threads)
            self._publish_events()
            self.metrics_server = self._start_metrics()
        except BaseException:
            self.store.close()
            raise
        logger.info(
            "LMDBTier at %s: namespace %s, %d-byte chunks, %d of %d bytes used",
            opts.path, self.namespace, self._slots.slot_bytes,
            self._chunks.occupancy().used_bytes, opts.capacity_bytes,
        )  # fmt: skip

    # -- start --------------------------------------------------------------------------------

    def _start_metrics(self) -> MetricsServer | None:
        opts, store = self.options, self.store
        self.metrics.set_occupancy_source(Tier.DISK, self._chunks.occupancy)
        self.metrics.set_store_source(lambda: store_snapshot(store))
        self.metrics.set_config_info(
            {
                "tier": self.tier_type,
                "disk_bytes": opts.capacity_bytes,
                "block_size": self._num_tokens_per_chunk,
                "eviction_policy": opts.eviction_policy,
                "namespace": self.namespace,
                "has_disk": True,
            }
        )
        if opts.metrics_port is None:
            return None
        server = start_metrics_server(
            opts.metrics_port, host=opts.metrics_host, registry=self.registry
        )
        logger.info("LMDBTier metrics on %s", server.url)
        return server

    # -- lookups ------------------------------------------------------------------------------

    def on_new_request(self, req_context: ReqContext) -> RequestOffloadingContext:
        return RequestOffloadingContext()

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        """HIT when the chunk is on disk and servable (a chunk still being written is a MISS:
        its bytes are in the primary tier)."""
        is_hit = self._chunks.lookup(BlockKey(key))
        tokens = self._num_tokens_per_chunk
        self.metrics.record_lookup(1, tokens, {Tier.DISK: (1, tokens)} if is_hit else {})
        return LookupResult.HIT if is_hit else LookupResult.MISS

    def touch(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        self._chunks.touch(BlockKey(key) for key in keys)

    # -- transfers ----------------------------------------------------------------------------

    def submit_store(self, job_metadata: TransferJob) -> None:
        """Reserve room (evicting by bytes) and queue the write of the chunks not on disk yet."""
        job = job_metadata
        slot_ids = self._slot_ids(job)
        if slot_ids is None:
            self._results.append(JobResult(job.job_id, success=False))
            return
        keys = [BlockKey(key) for key in job.keys]
        plan = self._chunks.plan_store(keys)
        self._publish_events()
        if not plan.positions:
            self._io.submit_delete(plan.victims)
            self._results.append(JobResult(job.job_id, success=plan.num_skipped == 0))
            return
        items = [(keys[i], slot_ids[i]) for i in plan.positions]
        self._stores[job.job_id] = plan.num_skipped
        self._io.submit_store(job.job_id, items, plan.victims)

    def submit_load(self, job_metadata: TransferJob) -> None:
        """Pin the chunks and queue their reads into the primary slots vLLM allocated."""
        job = job_metadata
        slot_ids = self._slot_ids(job)
        if slot_ids is None:
            self._results.append(JobResult(job.job_id, success=False))
            return
        keys = [BlockKey(key) for key in job.keys]
        pinned = self._chunks.pin_for_load(keys)
        items = [(key, slot) for key, slot, ok in zip(keys, slot_ids, pinned, strict=True) if ok]
        if not items:
            self._results.append(JobResult(job.job_id, success=not keys))
            return
        self._loads[job.job_id] = _LoadJob(tuple(job.keys), tuple(key for key, _ in items))
        self._io.submit_load(job.job_id, items)

    def _slot_ids(self, job: TransferJob) -> list[int] | None:
        slot_ids = [int(chunk_id) for chunk_id in job.chunk_ids]
        num_slots = self._slots.num_slots
        if len(slot_ids) != len(job.keys) or any(not 0 <= s < num_slots for s in slot_ids):
            logger.error(
                "LMDBTier: job %d has %d keys and chunk ids %s (the primary tier has %d slots)",
                job.job_id, len(job.keys), slot_ids[:8], num_slots,
            )  # fmt: skip
            return None
        return slot_ids

    def get_finished_jobs(self) -> Iterable[JobResult]:
        results, self._results = self._results, []
        for outcome in self._io.take_outcomes():
            if isinstance(outcome, StoreOutcome):
                results.append(self._finish_store(outcome))
            else:
                results.append(self._finish_load(outcome))
        self._publish_events()
        self._flush_touches()
        return results

    def _finish_store(self, outcome: StoreOutcome) -> JobResult:
        num_skipped = self._stores.pop(outcome.job_id)
        self._chunks.complete_store(outcome.ok, success=True)
        self._chunks.complete_store(outcome.failed, success=False)
        is_ok = not outcome.failed
        self.metrics.observe_transfer(
            Direction.CPU_TO_DISK, outcome.num_bytes, outcome.duration_s, is_ok
        )
        if outcome.num_io_errors:
            self.metrics.record_io_error(IOOp.WRITE, outcome.num_io_errors)
        return JobResult(
            outcome.job_id,
            success=is_ok and num_skipped == 0,
            transfer_time=outcome.duration_s,
            transfer_bytes=outcome.num_bytes,
        )

    def _finish_load(self, outcome: LoadOutcome) -> JobResult:
        job = self._loads.pop(outcome.job_id)
        self._chunks.complete_load(job.pinned, corrupt=outcome.corrupt, missing=outcome.missing)
        if outcome.corrupt:
            self.metrics.record_checksum_failure(Tier.DISK, len(outcome.corrupt))
            self._io.submit_delete(outcome.corrupt)
        if outcome.num_io_errors:
            self.metrics.record_io_error(IOOp.READ, outcome.num_io_errors)
        loaded = set(outcome.ok)
        successful = tuple(key for key in job.keys if BlockKey(key) in loaded)
        is_ok = len(successful) == len(job.keys)
        if not is_ok:
            self.metrics.record_load_failure(len(job.keys) - len(successful))
        self.metrics.observe_transfer(
            Direction.DISK_TO_CPU, outcome.num_bytes, outcome.duration_s, is_ok
        )
        self._touches.extend(outcome.ok)
        return JobResult(
            outcome.job_id,
            success=is_ok,
            successful_keys=None if is_ok or not successful else successful,
            transfer_time=outcome.duration_s,
            transfer_bytes=outcome.num_bytes,
        )

    def has_pending_work(self) -> bool:
        return bool(self._stores or self._loads or self._results)

    def drain_jobs(self) -> None:
        """Block until every submitted copy has finished (results wait for the next poll)."""
        self._io.drain()

    # -- steps and events ---------------------------------------------------------------------

    def on_schedule_end(self, context: ScheduleEndContext) -> None:
        self._chunks.end_step()  # this step's promotions are submitted (and pinned)
        self._flush_touches()

    def take_events(self) -> Iterable[OffloadingEvent]:
        if not self._events:
            return ()
        events, self._events = self._events, []
        return events

    def _publish_events(self) -> None:
        """Count the index's events and hand them to vLLM's publisher as STORAGE events."""
        events = self._chunks.take_events()
        if not events:
            return
        self.metrics.record_events(events)
        if self._events is None:
            return
        for event in events:
            self._events.append(
                OffloadingEvent(
                    keys=[OffloadKey(key) for key in event.keys],
                    medium=Medium.STORAGE,
                    removed=isinstance(event, ChunkRemoved),
                    locality=self.locality,
                    ownership=self.tier_type,
                    removal_expected=True,  # this tier reports every removal
                )
            )

    def _flush_touches(self, *, force: bool = False) -> None:
        now = time.monotonic()
        if self._touches and (force or now - self._last_touch_flush_s >= _TOUCH_FLUSH_INTERVAL_S):
            touches, self._touches = self._touches, []
            self._io.submit_touch(list(dict.fromkeys(touches)))
            self._last_touch_flush_s = now

    # -- shutdown -----------------------------------------------------------------------------

    def shutdown(self) -> None:
        """1. stop the metrics endpoint, 2. record pending hits, 3. finish the copies (up to
        `shutdown_timeout_s`), stop the threads, sync and close the store.

        Raises KVStoreError only if copies are still running, so vLLM keeps the primary region
        mapped (a later call tries again); other errors are logged. Idempotent.
        """
        if self._is_shut_down:
            return
        errors: list[str] = []
        server, self.metrics_server = self.metrics_server, None
        try:
            if server is not None:
                server.close()
        except Exception as exc:
            errors.append(f"metrics server: {exc}")
        self._flush_touches(force=True)
        timeout_s = self.options.shutdown_timeout_s
        errors += self._io.close(timeout_s)
        self._is_shut_down = self._io.drain(0)
        if errors:
            logger.error("LMDBTier shutdown errors: %s", "; ".join(errors))
        if not self._is_shut_down:
            raise KVStoreError(
                f"LMDBTier: disk I/O still running {timeout_s:.1f} s into shutdown "
                f"(shutdown_timeout_s); it may still use the primary CPU region"
            )
