"""The scheduler process's resources: CPU region, LMDB store, index, service, pipeline,
metrics, sinks.

`SchedulerRuntime.start()` builds them in order and `close()` tears them down with a deadline,
collecting errors: stop the metrics endpoint, stop intake, drain disk writes, flush the event
sinks, sync and close LMDB, remove the shared region.
"""

from __future__ import annotations

import logging
from typing import Any

from prometheus_client import CollectorRegistry

from kvstore.config import KVStoreConfig
from kvstore.diskwriter.client import DiskWriterProcess
from kvstore.errors import ConfigError
from kvstore.eventbus import EventBus, JSONLSink, ZMQPublisherSink
from kvstore.eventbus.sink import EventSink
from kvstore.index import IndexConfig, TierIndex
from kvstore.keys import Tier
from kvstore.metrics import (
    AUDIT_RESULTS,
    Direction,
    KVStoreMetrics,
    MetricsServer,
    Occupancy,
    serve_configured_metrics,
    store_snapshot,
)
from kvstore.namespace import NamespaceDescriptor, namespace_id
from kvstore.pipeline import TierPipeline
from kvstore.pipeline.disk_tier import DiskTierRequest, OpenedDisk, open_disk_tier
from kvstore.pipeline.load_cost import LoadCostModel
from kvstore.remote import RemoteAuthError, RemoteChunks, RemoteStore
from kvstore.service import TierService
from kvstore.service.disk_io import DiskIO
from kvstore.vllm.geometry import EngineGeometry
from tiers.cpu import CPURegion, reclaim_stale_regions
from tiers.errors import NamespaceError, TierError
from tiers.lmdb import LMDBStore

__all__ = ["SchedulerRuntime"]

logger = logging.getLogger(__name__)


class SchedulerRuntime:
    """Owns everything the scheduler-side connector needs; built once per engine."""

    def __init__(self, config: KVStoreConfig, geometry: EngineGeometry) -> None:
        self.config = config
        self.geometry = geometry
        self.descriptor: NamespaceDescriptor = geometry.namespace(config)
        self.namespace = namespace_id(self.descriptor)
        self.registry = CollectorRegistry()
        self.metrics = KVStoreMetrics(self.registry)
        self.region: CPURegion | None = None
        self.store: LMDBStore | None = None
        self.index: TierIndex | None = None
        self.service: TierService | None = None
        self.pipeline: TierPipeline | None = None
        self.metrics_server: MetricsServer | None = None
        self.num_cpu_rows = 0
        self.num_servable_chunks = 0  # disk chunks this engine can serve, found at start
        self.remote_display: str | None = None  # e.g. "redis://host:6379/0 (write on)"
        self._is_layout_registered = False

    # -- start ------------------------------------------------------------------------------

    def start(self) -> None:
        try:
            self._start()
        except BaseException:
            self.close()
            raise

    def _start(self) -> None:
        """1. the CPU region, 2. the disk store and the index (seeded from it), 3. the tier
        service (disk and remote I/O, event sinks), 4. the pipeline, 5. the metrics."""
        num_rows = self.num_cpu_rows = self._start_region()
        disk = self._open_disk()
        self.store = disk.store if disk is not None else None
        self.index = self._start_index(num_rows, disk)
        self.service = self._start_service()
        self.pipeline = TierPipeline(
            self.index,
            self.service,
            [self.metrics],
            num_tokens_per_chunk=self.geometry.num_tokens_per_chunk,
            cost=self._cost_model(),
            promotion_wait_s=self.config.promotion_wait_ms / 1000,
        )
        self._start_metrics(num_rows)

    def _cost_model(self) -> LoadCostModel | None:
        """`load_policy: cost` (loads from disk and Redis must beat recompute), else None."""
        if self.config.load_policy != "cost":
            return None
        return LoadCostModel(
            chunk_bytes=self.geometry.row_bytes,
            tokens_per_chunk=self.geometry.num_tokens_per_chunk,
            on_decision=self.metrics.record_load_decision,
        )

    def _start_region(self) -> int:
        config, geo = self.config, self.geometry
        num_rows = config.cpu_bytes // geo.row_bytes
        if num_rows < 1:
            raise ConfigError(
                f"cpu_bytes: {config.cpu_bytes} bytes is smaller than one chunk "
                f"({geo.row_bytes} bytes); raise cpu_bytes or lower block_size"
            )
        config.region_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        reclaim_stale_regions(config.region_dir, prefix="kvstore-")
        self.region = CPURegion.create(  # the workers pin their own mappings; this one
            geo.region_name, num_rows, geo.row_bytes, directory=config.region_dir, pin=False
        )  # is never copied to a device
        return num_rows

    def _open_disk(self) -> OpenedDisk | None:
        """The disk tier, opened and scanned (`open_disk_tier`: a damaged file means the CPU
        tier only, loudly; a bad path or too small a budget is a config error)."""
        config = self.config
        if config.disk_path is None:
            return None
        request = DiskTierRequest(
            path=config.disk_path,
            capacity_bytes=config.disk_bytes,
            namespace=self.namespace,
            chunk_bytes=self.geometry.row_bytes,
            path_label="disk_path",
            capacity_label="disk_bytes",
            fallback="running with the CPU tier only",
        )  # the namespace is registered with the worker's chunk layout (register_layout)
        return open_disk_tier(request, self.metrics)

    def _start_index(self, num_rows: int, disk: OpenedDisk | None) -> TierIndex:
        config, geo = self.config, self.geometry
        index = TierIndex(
            IndexConfig(
                num_cpu_rows=num_rows,
                chunk_bytes=geo.row_bytes,
                num_tokens_per_chunk=geo.num_tokens_per_chunk,
                disk_capacity_bytes=disk.budget_bytes if disk is not None else 0,
                cpu_policy=config.eviction_policy,
                disk_policy=config.disk_eviction_policy or config.eviction_policy,
                write_policy=config.write_policy,
                admission_min_sightings=config.admission_min_sightings,
            )
        )
        if disk is not None:
            self.num_servable_chunks = disk.seed(index.seed_disk)  # in the start-up line
        return index

    def _start_service(self) -> TierService:
        config, store, region = self.config, self.store, self.region
        assert region is not None  # _start_region ran
        service = TierService(
            disk=self._disk_io(store, region) if store is not None else None,
            metrics=self.metrics,
            publisher=self._event_bus(),
            max_queued_chunks=config.disk_queue_chunks,
            shutdown_timeout_s=config.shutdown_timeout_s,
            remote=self._remote_chunks(),
            remote_rows=region,
            remote_queue_chunks=config.remote_queue_chunks,
            hold_writes=True,  # until the namespace is registered (register_layout)
        )
        self.service = service  # closed by close() even if start fails
        try:
            service.start()
        except RemoteAuthError as exc:
            raise ConfigError(str(exc)) from exc
        return service

    def _disk_io(self, store: LMDBStore, region: CPURegion) -> DiskIO:
        """Reads here; writes in the disk-writer process (`disk_writer: process`), or on the
        service's writer thread when so configured or when the process cannot start."""
        if self.config.disk_writer == "thread":
            return DiskIO(store, self.namespace, region)
        try:
            writer = DiskWriterProcess.start(
                store_path=store.path, capacity_bytes=store.capacity_bytes, region_path=region.path
            )
        except TierError as exc:
            logger.warning(
                "kvstore: the disk-writer process did not start (%s); LMDB writes run on a "
                "thread of the engine's process (disk_writer: thread)",
                exc,
            )
            return DiskIO(store, self.namespace, region)
        return DiskIO(store, self.namespace, region, writer=writer)

    def _remote_chunks(self) -> RemoteChunks | None:
        """The shared remote tier, when `remote_url` is set (connected when the service
        starts; an unreachable server is a warning there, not an error)."""
        remote_config = self.config.remote_config()
        if remote_config is None:
            return None
        store = RemoteStore(remote_config, observer=self.metrics.remote)
        self.remote_display = "{} (write {})".format(
            remote_config.endpoint.display(), "on" if remote_config.enable_write else "off"
        )  # in the connector's start line
        return RemoteChunks(store, self.descriptor)

    def _event_bus(self) -> EventBus | None:
        config = self.config
        sinks: list[EventSink] = []
        if config.events_endpoint:
            sinks.append(
                ZMQPublisherSink(
                    config.events_endpoint,
                    topic=config.events_topic.encode(),
                    replay_endpoint=config.events_replay_endpoint,
                )
            )
        if config.events_log is not None:
            sinks.append(JSONLSink(config.events_log, max_bytes=config.events_log_max_bytes))
        return EventBus(sinks, metrics=self.metrics) if sinks else None

    def _start_metrics(self, num_rows: int) -> None:
        config, geo = self.config, self.geometry
        self.metrics.set_key_stability(geo.is_hash_stable)
        self.metrics.set_hybrid_manager_off(geo.num_local_layers > 0)
        self.metrics.set_config_info(
            {
                "cpu_bytes": config.cpu_bytes,
                "disk_bytes": config.disk_bytes,
                "block_size": geo.num_tokens_per_chunk,
                "eviction_policy": config.eviction_policy,
                "write_policy": config.write_policy,
                "namespace": self.namespace,
                "has_disk": self.store is not None,
            }
        )
        self.metrics.set_occupancy_source(Tier.CPU, self._occupancy_source(Tier.CPU, num_rows))
        store = self.store
        if store is not None:
            self.metrics.set_occupancy_source(Tier.DISK, self._occupancy_source(Tier.DISK, None))
            self.metrics.set_store_source(lambda: store_snapshot(store))
        self.metrics_server = serve_configured_metrics(
            config.metrics_port, config.metrics_host, registry=self.registry,
            port_label="metrics_port",
        )  # fmt: skip

    def _occupancy_source(self, tier: Tier, num_rows: int | None) -> Any:
        def read() -> Occupancy:
            index = self.index
            if index is None:
                return Occupancy()
            stats = index.stats()
            tier_stats = stats.cpu if tier is Tier.CPU else stats.disk
            if tier_stats is None:
                return Occupancy()
            return Occupancy(
                used_bytes=tier_stats.used_bytes,
                capacity_bytes=tier_stats.capacity_bytes,
                num_entries=tier_stats.num_entries,
                used_rows=tier_stats.num_entries if num_rows is not None else None,
                capacity_rows=num_rows,
            )

        return read

    # -- namespace --------------------------------------------------------------------------

    def register_layout(self, layout: dict[str, Any]) -> None:
        """Record the worker's chunk layout with the namespace, so the CLI can decode chunks;
        the service holds disk writes until then (a remote hit can land before the first step)."""
        store, service = self.store, self.service
        if self._is_layout_registered or service is None:
            return
        self._is_layout_registered = True
        if service.remote is not None:
            service.remote.chunks.add_to_descriptor(chunk_layout=layout)
        if store is None:
            return
        descriptor = self.descriptor.to_dict()
        descriptor["chunk_layout"] = layout
        namespace = self.namespace

        def register() -> None:  # on the LMDB writer thread, before any write of this namespace
            try:
                store.register_namespace(namespace, descriptor)
            except NamespaceError as exc:
                logger.error("kvstore: disk namespace conflict, disk writes will fail: %s", exc)
            except TierError as exc:
                logger.error("kvstore: could not register the disk namespace: %s", exc)

        service.release_writes(first=register)

    # -- reporting --------------------------------------------------------------------------

    def startup_facts(self) -> dict[str, Any]:
        """What the connector's one start-up line says (see `kvstore.vllm.startup`)."""
        return {
            "num_cpu_rows": self.num_cpu_rows,
            "has_disk": self.store is not None,
            "num_servable_chunks": self.num_servable_chunks,
            "remote": self.remote_display,
            "num_tokens_per_chunk": self.geometry.num_tokens_per_chunk,
            "row_bytes": self.geometry.row_bytes,
            "namespace": self.namespace,
        }

    def summary(self) -> dict[str, Any]:
        """Per-tier counters from this engine's metrics (for the demo, tests and logs)."""

        def value(name: str, **labels: str) -> float:
            return self.registry.get_sample_value(name, labels) or 0.0

        tiers: dict[str, Any] = {}
        for tier in Tier:
            tiers[tier.value] = {
                "hit_chunks": value("kvstore_hit_chunks_total", tier=tier.value),
                "hit_tokens": value("kvstore_hit_tokens_total", tier=tier.value),
                "stored_chunks": value("kvstore_stored_chunks_total", tier=tier.value),
                "evicted_chunks": value("kvstore_evicted_chunks_total", tier=tier.value),
                "checksum_failures": value("kvstore_checksum_failures_total", tier=tier.value),
            }
        directions = [direction.value for direction in Direction]
        return {
            "namespace": self.namespace,
            "lookups": value("kvstore_lookups_total"),
            "lookup_tokens": value("kvstore_lookup_tokens_total"),
            "tiers": tiers,
            "bytes": {d: value("kvstore_transfer_bytes_total", direction=d) for d in directions},
            "write_through_dropped": value(
                "kvstore_queue_dropped_total", queue="write_through", reason="queue_full"
            ),
            "load_failed_chunks": value("kvstore_load_failed_chunks_total"),
            "load_audit": {
                result: value("kvstore_load_audit_chunks_total", result=result)
                for result in AUDIT_RESULTS
            },
        }

    # -- close ------------------------------------------------------------------------------

    def close(self) -> None:
        errors: list[str] = []
        steps = (
            ("metrics server", self._close_metrics),
            ("pipeline", self._settle_pipeline),
            ("service", self._close_service),
            ("store", self._close_store),
            ("region", self._close_region),
        )
        for name, step in steps:
            try:
                step()
            except Exception as exc:
                errors.append(f"{name}: {exc}")
        if errors:
            logger.error("kvstore shutdown errors: %s", "; ".join(errors))

    def _settle_pipeline(self) -> None:
        """Apply what the service finished since vLLM's last step (its events reach the sinks)."""
        pipeline, self.pipeline = self.pipeline, None
        if pipeline is not None:
            pipeline.settle()

    def _close_service(self) -> None:
        service, self.service = self.service, None
        if service is not None:
            service.close()  # drains writes, syncs and closes LMDB, flushes sinks
            self.store = None

    def _close_metrics(self) -> None:
        server, self.metrics_server = self.metrics_server, None
        if server is not None:
            server.close()

    def _close_store(self) -> None:
        store, self.store = self.store, None
        if store is not None:
            store.close()

    def _close_region(self) -> None:
        region, self.region = self.region, None
        if region is not None:
            region.close()
