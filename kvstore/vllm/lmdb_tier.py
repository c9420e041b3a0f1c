"""`LMDBTier`: kvstore's LMDB store as a secondary tier of vLLM's own `TieringOffloadingSpec`.

GPU users of vLLM's native offloading (the `OffloadingConnector` with its CPU tier) add a
bounded, persistent, checksummed disk tier that the `kvstore` CLI can inspect:

    "kv_connector_extra_config": {"spec_name": "TieringOffloadingSpec", "cpu_bytes_to_use": ...,
        "secondary_tiers": [{"type": "LMDBTier", "module_path": "kvstore.vllm",
                             "path": "/nvme/kvstore", "capacity_bytes": "100GiB"}]}

vLLM cascades every chunk stored to its CPU tier here (`submit_store`) and promotes disk hits
back into CPU slots (`lookup` -> `submit_load`). The tier is a thin adapter over the disk tier
`KVStoreConnector` uses too: `DiskIndex` (placement by bytes, pins, events) and `TierService`
(one LMDB writer thread, a reader pool, a bounded write queue, owned tasks, one shutdown
deadline). `TierJobs` maps the service's answers back onto vLLM's jobs.
"""

from __future__ import annotations

import logging
import threading
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

from kvstore.errors import ConfigError, KVStoreError
from kvstore.events import ChunkRemoved, TierEvent
from kvstore.index.disk import DiskCandidate
from kvstore.index.event_log import EventLog
from kvstore.keys import BlockKey, Tier
from kvstore.metrics import KVStoreMetrics, MetricsServer, start_metrics_server, store_snapshot
from kvstore.namespace import NamespaceDescriptor, namespace_id
from kvstore.service import PromotionDone, TierService, WriteDone
from kvstore.service.disk_io import DiskIO
from kvstore.vllm.geometry import _device_type
from kvstore.vllm.lmdb_tier_jobs import LoadJob, TierJobs
from kvstore.vllm.lmdb_tier_options import LMDBTierOptions, tier_descriptor
from kvstore.vllm.lmdb_tier_store import PrimarySlots, open_tier_store, seeded_index

if TYPE_CHECKING:
    from vllm.v1.kv_offload.base import OffloadingSpec
    from vllm.v1.kv_offload.tiering.backpressure import BackpressureDetector

__all__ = ["LMDBTier"]

logger = logging.getLogger(__name__)

_DRAIN_POLL_S = 0.5


class LMDBTier(SecondaryTierManager):
    """A bounded, persistent, checksummed LMDB disk tier behind vLLM's primary CPU tier.

    Threading: vLLM calls every method under its tiering manager's lock, so never two at once:
    from the scheduler thread, and on vLLM >= 0.33 possibly from the manager's tier-poll
    thread (another tier's fan-out); nothing here depends on which thread it is. None blocks
    on I/O except `__init__` (opens and scans the store at engine start), `drain_jobs` and
    `shutdown` (which wait by contract). The caller alone owns the index and the job tables.
    The copies run on the `TierService`'s threads, which read and write only the primary slots
    vLLM pinned for the job; their answers are applied when vLLM polls `get_finished_jobs`.
    The metrics exporter thread reads plain counters only.

    Failures are results, never exceptions into vLLM: a store that cannot be written (disk
    full, I/O error, no room, queue full) finishes unsuccessfully; a chunk that fails its
    checksum on load is left out of `successful_keys`, deleted and counted (vLLM frees the
    slot it was read into without using it).
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
        self._log = EventLog(self._num_tokens_per_chunk)
        self._jobs = TierJobs(self._slots.slot_bytes)
        self._looked_up: set[BlockKey] = set()  # this step's hits: kept until their load
        self._is_closing = False
        self._is_shut_down = False
        self.metrics_server: MetricsServer | None = None
        self._start()

    # -- start --------------------------------------------------------------------------------

    def _start(self) -> None:
        """Open and scan the store, then start the I/O threads and the metrics endpoint."""
        opts = self.options
        self.store = open_tier_store(opts, self.descriptor, self._slots.slot_bytes)
        try:  # no thread has started yet: closing the store undoes everything
            self._index = seeded_index(self.store, opts, self.descriptor, self._log)
            self._service = TierService(
                disk=DiskIO(self.store, self.namespace, self._slots),
                metrics=self.metrics,
                max_queued_chunks=self._slots.num_slots,  # a queued write pins a primary slot
                shutdown_timeout_s=opts.shutdown_timeout_s,
                num_read_threads=opts.num_read_threads,
            )
        except BaseException:
            self.store.close()
            raise
        try:
            self._service.start()
            self._publish_events()
            self.metrics_server = self._start_metrics()
        except BaseException:
            self._service.close()  # closes the store too
            raise
        logger.info(
            "LMDBTier at %s: namespace %s, %d-byte chunks, %d of %d bytes used",
            opts.path, self.namespace, self._slots.slot_bytes,
            self._index.occupancy().used_bytes, opts.capacity_bytes,
        )  # fmt: skip

    def _start_metrics(self) -> MetricsServer | None:
        opts, store = self.options, self.store
        self.metrics.set_occupancy_source(Tier.DISK, self._index.occupancy)
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
        try:
            server = start_metrics_server(
                opts.metrics_port, host=opts.metrics_host, registry=self.registry
            )
        except OSError as exc:
            raise ConfigError(
                f"LMDBTier option 'metrics_port': cannot listen on {opts.metrics_host}:"
                f"{opts.metrics_port}: {exc.strerror or exc}"
            ) from exc
        logger.info("LMDBTier metrics on %s", server.url)
        return server

    # -- lookups ------------------------------------------------------------------------------

    def on_new_request(self, req_context: ReqContext) -> RequestOffloadingContext:
        return RequestOffloadingContext()

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        """HIT when the chunk is on disk and servable (a chunk still being written is a MISS:
        its bytes are in the primary tier). A hit is not evicted before the step ends, by
        when vLLM has submitted (and this tier pinned) its load."""
        block = BlockKey(key)
        is_hit = self._index.is_ready(block)
        if is_hit:
            self._looked_up.add(block)
        tokens = self._num_tokens_per_chunk
        self.metrics.record_lookup(1, tokens, {Tier.DISK: (1, tokens)} if is_hit else {})
        return LookupResult.HIT if is_hit else LookupResult.MISS

    def touch(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        """Refresh the chunks' recency (vLLM 0.32/0.33; 0.34 dropped `touch` from the tier
        interface, and a chunk's recency there is its last store or load)."""
        self._index.touch(BlockKey(key) for key in keys)

    # -- transfers ----------------------------------------------------------------------------

    def submit_store(self, job_metadata: TransferJob) -> None:
        """Reserve room (evicting by bytes) and queue the write of the chunks not on disk yet."""
        job = job_metadata
        slot_ids = self._slot_ids(job)
        if slot_ids is None:
            self._jobs.finish_now(job.job_id, success=False)
            return
        slot_of = dict(zip((BlockKey(key) for key in job.keys), slot_ids, strict=True))
        plan = self._index.reserve((DiskCandidate(key) for key in slot_of), self._looked_up)
        self._publish_events()
        if not plan.keys:  # all on disk already, or nothing fits: no I/O
            self._service.submit_delete(plan.evicted)
            self._jobs.finish_now(job.job_id, success=not plan.skipped)
            return
        items = [(key, slot_of[key]) for key in plan.keys]
        if not self._service.submit_write(items, plan.evicted):  # queue full, disk down
            self._index.complete(plan.keys, False)
            self._jobs.finish_now(job.job_id, success=False)
            return
        self._jobs.start_store(job.job_id, plan.keys, len(plan.skipped))

    def submit_load(self, job_metadata: TransferJob) -> None:
        """Pin the chunks and queue their reads into the primary slots vLLM allocated."""
        job = job_metadata
        slot_ids = self._slot_ids(job)
        if slot_ids is None:
            self._jobs.finish_now(job.job_id, success=False)
            return
        keys = [BlockKey(key) for key in job.keys]
        pinned = self._index.pin(keys)
        items = [(key, slot) for key, slot, ok in zip(keys, slot_ids, pinned, strict=True) if ok]
        if len(items) < len(keys):
            self.metrics.record_load_failure(len(keys) - len(items))
        if not items:
            self._jobs.finish_now(job.job_id, success=not keys)
            return
        load = LoadJob(tuple(job.keys), tuple(key for key, _ in items))
        if not self._service.submit_promotion(items, tag=job.job_id):  # shut down
            self._index.finish_read(load.pinned)
            self.metrics.record_load_failure(len(items))
            self._jobs.finish_now(job.job_id, success=False)
            return
        self._jobs.start_load(job.job_id, load)

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
        self._apply_completions()
        return self._jobs.take_results()

    def _apply_completions(self) -> None:
        """Apply what the service finished to the index, the jobs and the events."""
        for done in self._service.drain_completions():
            if isinstance(done, WriteDone):
                self._index.complete(done.ok, True)
                self._index.complete(done.failed, False)
                self._jobs.writes_done(done)
            elif isinstance(done, PromotionDone):
                self._finish_load(done)
        self._publish_events()

    def _finish_load(self, done: PromotionDone) -> None:
        load = self._jobs.load_done(done)
        if load is None:
            return
        self._index.discard(done.missing, "deleted")  # by another process (`kvstore rm`)
        self._index.finish_read(load.pinned, corrupt=done.corrupt)  # the service deletes them
        num_lost = len(load.pinned) - len(done.ok)
        if num_lost:
            self.metrics.record_load_failure(num_lost)
        self._service.submit_touch(done.ok)  # hit counts and times on disk, batched

    def has_pending_work(self) -> bool:
        return self._jobs.has_pending_work

    def drain_jobs(self) -> None:
        """Block until every submitted job has finished (results wait for the next poll) and
        the disk work they caused (evictions, deletes of corrupt values) has run."""
        while self._jobs.is_busy and not self._is_closing:
            self._service.wait_idle(_DRAIN_POLL_S)
            self._apply_completions()
        if not self._is_closing and self._service.is_disk_up:
            ran = threading.Event()
            self._service.submit_call(ran.set)  # runs after every queued write and delete
            if not ran.wait(self.options.shutdown_timeout_s):
                logger.warning("LMDBTier: queued deletes still running after drain_jobs")

    # -- steps and events ---------------------------------------------------------------------

    def on_schedule_end(self, context: ScheduleEndContext) -> None:
        self._looked_up.clear()  # this step's loads are submitted (and pinned)

    def take_events(self) -> Iterable[OffloadingEvent]:
        if not self._events:
            return ()
        events, self._events = self._events, []
        return events

    def _publish_events(self) -> None:
        """Count the index's events and hand them to vLLM's publisher as STORAGE events."""
        events = self._log.take()
        if not events:
            return
        self.metrics.record_events(events)
        if self._events is not None:
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
        self._apply_completions()
        unanswered = self._jobs.fail_pending()
        if unanswered:
            logger.warning("LMDBTier: %d jobs failed at shutdown", len(unanswered))


def storage_events(
    events: Sequence[TierEvent], locality: Locality | None, ownership: str
) -> list[OffloadingEvent]:
    """vLLM's STORAGE events for the index's events, in order; a run of stores (or removals)
    becomes one event. This tier reports every removal (`removal_expected`)."""
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
