"""`LMDBTier`: vLLM's `SecondaryTierManager` calls, translated into `DiskPipeline` operations.

vLLM cascades every chunk stored to its CPU tier here (`submit_store`) and promotes disk hits
back into CPU slots (`lookup` -> `submit_load`). Every rule (placement, eviction, roll-back,
completions, discard reasons, touches, metrics, events) is the pipeline's
(`kvstore.pipeline.disk`), and the tier starts through `open_disk_tier` as the connector does.
This class maps vLLM's calls and jobs onto them (`TierJobs` keeps the jobs) and decides nothing
about the tier.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Iterable, Sequence
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
from kvstore.events import ChunkRemoved, TierEvent
from kvstore.index.disk import DiskIndex
from kvstore.index.event_log import EventLog
from kvstore.keys import BlockKey, Tier
from kvstore.metrics import KVStoreMetrics, MetricsServer, serve_configured_metrics, store_snapshot
from kvstore.namespace import NamespaceDescriptor, namespace_id
from kvstore.pipeline.disk import DiskPipeline
from kvstore.pipeline.disk_tier import DiskTierRequest, OpenedDisk, open_disk_tier
from kvstore.service import TierService
from kvstore.service.disk_io import DiskIO
from kvstore.vllm.geometry import _device_type
from kvstore.vllm.lmdb_tier.jobs import TierJobs
from kvstore.vllm.lmdb_tier.options import LMDBTierOptions, option_label, tier_descriptor
from kvstore.vllm.lmdb_tier.slots import PrimarySlots

if TYPE_CHECKING:
    from vllm.v1.kv_offload.base import OffloadingSpec
    from vllm.v1.kv_offload.tiering.backpressure import BackpressureDetector

__all__ = ["LMDBTier", "storage_events"]

logger = logging.getLogger(__name__)


class LMDBTier(SecondaryTierManager):
    """A bounded, persistent, checksummed LMDB disk tier behind vLLM's primary CPU tier.

    Threading: vLLM calls every method under its tiering manager's lock, so never two at once:
    from the scheduler thread, and on vLLM >= 0.33 possibly from the manager's tier-poll
    thread (another tier's fan-out); nothing here depends on which thread it is. None blocks
    on I/O except `__init__` (opens and scans the store at engine start), `drain_jobs` and
    `shutdown` (which wait by contract). The copies run on the tier service's threads, which
    read and write only the primary slots vLLM pinned for the job; their results are applied
    when vLLM polls `get_finished_jobs`. The metrics exporter thread reads plain counters only.

    Failures are results, never exceptions into vLLM: a store that cannot be written fails its
    job; a chunk that cannot be loaded (corrupt, deleted, unreadable) is left out of the job's
    `successful_keys` (vLLM frees the slot it was read into without using it). A damaged store
    file does not stop the engine: the tier answers MISS and fails its jobs (`open_disk_tier`).
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
        self.registry = CollectorRegistry()
        self.metrics = KVStoreMetrics(self.registry)
        is_published = offloading_spec.kv_events_config.enable_kv_cache_events
        self._events: list[OffloadingEvent] | None = (
            [] if opts.enable_kv_events and is_published else None
        )
        self._jobs = TierJobs(self._slots.slot_bytes)
        self._is_closing = False
        self._is_shut_down = False
        self.metrics_server: MetricsServer | None = None
        self._start()

    # -- start --------------------------------------------------------------------------------

    def _start(self) -> None:
        """Open and scan the store, then start the I/O threads and the metrics endpoint."""
        opts = self.options
        disk = open_disk_tier(self._disk_request(), self.metrics)
        self.store = store = disk.store
        try:  # no thread has started yet: closing the store undoes everything
            self.pipeline = self._build_pipeline(disk)
        except BaseException:
            if store is not None:
                store.close()
            raise
        try:
            self._service.start()
            self._publish_events()  # the chunks found on disk
            self._start_metrics()
        except BaseException:
            self._service.close()  # closes the store too
            raise
        logger.info(
            "LMDBTier at %s: namespace %s, %d-byte chunks, %d of %d bytes used%s",
            opts.path, self.namespace, self._slots.slot_bytes,
            self.pipeline.index.occupancy().used_bytes, disk.budget_bytes,
            "" if store is not None else " (store unreadable: every lookup is a MISS)",
        )  # fmt: skip

    def _disk_request(self) -> DiskTierRequest:
        opts = self.options
        return DiskTierRequest(
            path=opts.path,
            capacity_bytes=opts.capacity_bytes,
            namespace=self.namespace,
            chunk_bytes=self._slots.slot_bytes,
            path_label=option_label("path"),
            capacity_label=option_label("capacity_bytes"),
            descriptor=self.descriptor.to_dict(),
            fallback="LMDBTier answers every lookup MISS and fails every job",
        )

    def _build_pipeline(self, disk: OpenedDisk) -> DiskPipeline:
        opts, slots, store = self.options, self._slots, disk.store
        log = EventLog(self.descriptor.num_tokens_per_chunk)
        index = DiskIndex(opts.eviction_policy, disk.budget_bytes, slots.slot_bytes, log)
        disk.seed(index.seed)
        self._service = TierService(
            disk=DiskIO(store, self.namespace, slots) if store is not None else None,
            metrics=self.metrics,
            max_queued_chunks=slots.num_slots,  # a queued write pins a primary slot
            shutdown_timeout_s=opts.shutdown_timeout_s,
            num_read_threads=opts.num_read_threads,
        )
        return DiskPipeline(
            index,
            log,
            self._service,
            [self.metrics],
            num_tokens_per_chunk=self.descriptor.num_tokens_per_chunk,
        )

    def _start_metrics(self) -> None:
        opts, store = self.options, self.store
        self.metrics.set_occupancy_source(Tier.DISK, self.pipeline.index.occupancy)
        if store is not None:
            self.metrics.set_store_source(lambda: store_snapshot(store))
        self.metrics.set_config_info(
            {
                "tier": self.tier_type,
                "disk_bytes": opts.capacity_bytes,
                "block_size": self.descriptor.num_tokens_per_chunk,
                "eviction_policy": opts.eviction_policy,
                "namespace": self.namespace,
                "has_disk": store is not None,
            }
        )
        self.metrics_server = serve_configured_metrics(
            opts.metrics_port, opts.metrics_host, registry=self.registry,
            port_label=option_label("metrics_port"),
        )  # fmt: skip

    # -- lookups ------------------------------------------------------------------------------

    def on_new_request(self, req_context: ReqContext) -> RequestOffloadingContext:
        return RequestOffloadingContext()

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        return LookupResult.HIT if self.pipeline.lookup(BlockKey(key)) else LookupResult.MISS

    def touch(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        """vLLM 0.32/0.33 (0.34 dropped `touch`: a chunk's recency there is its last store or
        load)."""
        self.pipeline.touch(BlockKey(key) for key in keys)

    def on_schedule_end(self, context: ScheduleEndContext) -> None:
        self.pipeline.end_step()

    # -- transfers ----------------------------------------------------------------------------

    def submit_store(self, job_metadata: TransferJob) -> None:
        job = job_metadata
        items = self._items(job)
        if items is None:
            self._jobs.finish_now(job.job_id, success=False)
            return
        plan = self.pipeline.prepare_store(items)
        if not plan.keys:  # all on disk already, nothing fits, or refused: no I/O
            is_ok = not plan.is_refused and not plan.skipped
            self._jobs.finish_now(job.job_id, success=is_ok)
            return
        self._jobs.start_store(job.job_id, plan.keys, len(plan.skipped))

    def submit_load(self, job_metadata: TransferJob) -> None:
        job = job_metadata
        items = self._items(job)
        if items is None:
            self._jobs.finish_now(job.job_id, success=False)
            return
        plan = self.pipeline.prepare_load(items, tag=job.job_id)
        if not plan.keys:  # nothing could be read
            self._jobs.finish_now(job.job_id, success=not items)
            return
        self._jobs.start_load(job.job_id, tuple(job.keys))

    def _items(self, job: TransferJob) -> list[tuple[BlockKey, int]] | None:
        """The job's (key, primary slot) pairs; None when vLLM's job does not fit its tier."""
        slot_ids = [int(chunk_id) for chunk_id in job.chunk_ids]
        num_slots = self._slots.num_slots
        if len(slot_ids) != len(job.keys) or any(not 0 <= s < num_slots for s in slot_ids):
            logger.error(
                "LMDBTier: job %d has %d keys and chunk ids %s (the primary tier has %d slots)",
                job.job_id, len(job.keys), slot_ids[:8], num_slots,
            )  # fmt: skip
            return None
        return [(BlockKey(key), slot) for key, slot in zip(job.keys, slot_ids, strict=True)]

    def get_finished_jobs(self) -> Iterable[JobResult]:
        self._finish_jobs()
        return self._jobs.take_results()

    def _finish_jobs(self) -> None:
        for done in self.pipeline.poll():
            self._jobs.finished(done)
        self._publish_events()

    def has_pending_work(self) -> bool:
        return self._jobs.has_pending_work

    def drain_jobs(self) -> None:
        """Block until every submitted job has finished (results wait for the next poll) and
        the disk work they caused has run. Past `shutdown_timeout_s` it says so and waits on:
        vLLM must not reuse a primary slot a copy still uses."""
        waited_s = 0.0
        while not self._is_closing and not self.pipeline.drain(self.options.shutdown_timeout_s):
            waited_s += self.options.shutdown_timeout_s
            logger.warning("LMDBTier: disk I/O still running %.0f s into drain_jobs", waited_s)

    # -- events -------------------------------------------------------------------------------

    def take_events(self) -> Iterable[OffloadingEvent]:
        self._publish_events()
        if not self._events:
            return ()
        events, self._events = self._events, []
        return events

    def _publish_events(self) -> None:
        """The pipeline's events (already counted) as vLLM's STORAGE events, when published."""
        events = self.pipeline.take_events()
        if events and self._events is not None:
            self._events += storage_events(events, self.locality, self.tier_type)

    # -- shutdown -----------------------------------------------------------------------------

    def shutdown(self) -> None:
        """1. stop the metrics endpoint, 2. finish the copies and record pending hits (up to
        `shutdown_timeout_s`), stop the threads, sync and close the store, 3. fail the jobs the
        service did not answer.

        Raises KVStoreError only if copies are still running, so vLLM keeps the primary region
        mapped (a later call tries again); other errors are logged. Idempotent.
        """
        if self._is_shut_down:
            return
        self._is_closing = True
        server, self.metrics_server = self.metrics_server, None
        if server is not None:
            try:
                server.close()
            except OSError as exc:
                logger.error("LMDBTier: closing the metrics endpoint failed: %s", exc)
        if not self._service.close():
            raise KVStoreError(
                f"LMDBTier: disk I/O still running {self.options.shutdown_timeout_s:.1f} s "
                f"into shutdown (shutdown_timeout_s); it may still use the primary CPU region"
            )
        self._is_shut_down = True
        try:
            self._slots.release()
        except BufferError as exc:  # a view of it is still exported: it goes with its owner
            logger.error("LMDBTier: the primary view is still in use: %s", exc)
        self._finish_jobs()
        unanswered = self._jobs.fail_pending()
        if unanswered:
            logger.warning("LMDBTier: %d jobs failed at shutdown", len(unanswered))


def storage_events(
    events: Sequence[TierEvent], locality: Locality | None, ownership: str
) -> list[OffloadingEvent]:
    """vLLM's STORAGE events for the pipeline's events, in order; a run of stores (or
    removals) becomes one event. This tier reports every removal (`removal_expected`)."""
    out: list[OffloadingEvent] = []
    for event in events:
        is_removed = isinstance(event, ChunkRemoved)
        keys = [OffloadKey(key) for key in event.keys]
        if out and out[-1].removed == is_removed:
            out[-1].keys.extend(keys)
            continue
        out.append(
            OffloadingEvent(
                keys=keys,
                medium=Medium.STORAGE,
                removed=is_removed,
                locality=locality,
                ownership=ownership,
                removal_expected=True,
            )
        )
    return out
