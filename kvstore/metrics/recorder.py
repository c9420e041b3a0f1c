"""`KVStoreMetrics`: the typed recording API the tier service, the connector and the bus call.

Threading: every method is thread-safe (prometheus-client's values are atomic; the custom
collectors lock). Nothing here does I/O; the exporter reads the registry from its own thread.
"""

from __future__ import annotations

import logging
import platform
from collections.abc import Callable, Mapping, Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Info

from kvstore import __version__
from kvstore.events import ChunkRemoved, ChunkStored, TierEvent
from kvstore.keys import Tier
from kvstore.metrics import names
from kvstore.metrics.collectors import (
    Occupancy,
    OccupancyCollector,
    OccupancySource,
    PipelineCollector,
    StoreCollector,
    StoreSnapshot,
    TransferCollector,
)
from kvstore.metrics.labels import (
    AUDIT_RESULTS,
    DROP_REASONS,
    LOAD_DECISION_TIERS,
    LOAD_DECISIONS,
    REMOVAL_REASONS,
    SINK_NAMES,
    TIERS,
    Direction,
    IOOp,
    QueueName,
    removal_reason,
)
from kvstore.metrics.remote import RemoteMetrics
from kvstore.metrics.stats import TransferStats

__all__ = ["KVStoreMetrics", "register_build_info"]

logger = logging.getLogger(__name__)

TierHits = tuple[int, int]
"""(chunks, tokens) found in one tier by one lookup."""


def register_build_info(registry: CollectorRegistry) -> None:
    """`kvstore_build_info{version, python_version} 1` on `registry`."""
    build = Info(names.BUILD_INFO.removesuffix("_info"), "kvstore build.", registry=registry)
    build.info({"version": __version__, "python_version": platform.python_version()})


def _check_count(name: str, n: int) -> None:
    if n < 0:
        raise ValueError(f"{name} must be >= 0, got {n}")


class KVStoreMetrics:
    """kvstore's metrics on one `CollectorRegistry`; every labelled series exists from the start.

    Pass a fresh registry per engine (and per test). The shipped sinks' series (`SINK_NAMES`)
    exist from the start; the bus adds any other sink's with `add_sink`.
    """

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self._register_tiers(registry)
        self._register_transfers(registry)
        self._register_queues(registry)
        self._register_errors(registry)
        self.remote = RemoteMetrics(registry, self._checksum)
        register_build_info(registry)
        self._config = Info(
            names.CONFIG_INFO.removesuffix("_info"), "kvstore configuration.", registry=registry
        )

    def _register_tiers(self, r: CollectorRegistry) -> None:
        """Lookups, hits, placement, and whether each tier serves."""
        self._lookups = Counter(names.LOOKUPS, "Lookups (prefix queries from vLLM).", registry=r)
        self._lookup_chunks = Counter(
            names.LOOKUP_CHUNKS, "Chunks asked for by lookups.", registry=r
        )
        self._lookup_tokens = Counter(
            names.LOOKUP_TOKENS, "Tokens asked for by lookups.", registry=r
        )
        tier = ["tier"]
        self._hit_chunks = Counter(names.HIT_CHUNKS, "Chunks found, per tier.", tier, registry=r)
        self._hit_tokens = Counter(names.HIT_TOKENS, "Tokens found, per tier.", tier, registry=r)
        self._stored = Counter(names.STORED_CHUNKS, "Chunks stored, per tier.", tier, registry=r)
        self._removed = Counter(
            names.REMOVED_CHUNKS, "Chunks removed, per tier and reason.", ["tier", "reason"],
            registry=r,
        )  # fmt: skip
        self._evicted = Counter(names.EVICTED_CHUNKS, "Chunks evicted, per tier.", tier, registry=r)
        self._checksum = Counter(
            names.CHECKSUM_FAILURES, "Values whose checksum did not match.", tier, registry=r
        )
        for t in TIERS:
            for counter in (self._hit_chunks, self._hit_tokens, self._stored, self._evicted):
                counter.labels(t.value)
            self._checksum.labels(t.value)
            for reason in REMOVAL_REASONS:
                self._removed.labels(t.value, reason)
        self._tier_up = Gauge(
            names.TIER_UP,
            "1 while a tier serves, 0 once its I/O task died for good.",
            ["tier"],
            registry=r,
        )
        for tier_up in TIERS:
            self._tier_up.labels(tier_up.value).set(1)

    def _register_transfers(self, r: CollectorRegistry) -> None:
        """Transfers per direction, occupancy, and the store file."""
        self._transfers = TransferCollector()
        r.register(self._transfers)
        self._occupancy = OccupancyCollector()
        r.register(self._occupancy)
        self._store_source: Callable[[], StoreSnapshot | None] | None = None
        r.register(StoreCollector(self._read_store, include_occupancy=False))
        self._pipeline = PipelineCollector()
        r.register(self._pipeline)

    def _register_queues(self, r: CollectorRegistry) -> None:
        """Bounded queues and event sinks."""
        self._queue_depth = Gauge(names.QUEUE_DEPTH, "Items waiting.", ["queue"], registry=r)
        self._queue_capacity = Gauge(
            names.QUEUE_CAPACITY, "Bound of a queue.", ["queue"], registry=r
        )
        self._queue_dropped = Counter(
            names.QUEUE_DROPPED, "Work items dropped.", ["queue", "reason"], registry=r
        )
        for q in QueueName:
            self._queue_depth.labels(q.value)
            self._queue_capacity.labels(q.value)
            for reason in DROP_REASONS:
                self._queue_dropped.labels(q.value, reason)
        self._sink_written = Counter(
            names.SINK_WRITTEN_EVENTS, "Events written by a sink.", ["sink"], registry=r
        )
        self._sink_dropped = Counter(
            names.SINK_DROPPED_EVENTS, "Events a sink lost.", ["sink", "reason"], registry=r
        )
        self._sink_errors = Counter(
            names.SINK_ERRORS, "Sink writes that failed.", ["sink"], registry=r
        )
        for sink in SINK_NAMES:
            self.add_sink(sink)

    def _register_errors(self, r: CollectorRegistry) -> None:
        """I/O errors, failed and audited loads, and key stability."""
        self._io_errors = Counter(names.IO_ERRORS, "Storage I/O errors.", ["op"], registry=r)
        for op in IOOp:
            self._io_errors.labels(op.value)
        self._load_failed = Counter(
            names.LOAD_FAILED_CHUNKS, "Chunks whose load was reported failed to vLLM.", registry=r
        )
        self._load_audit = Counter(
            names.LOAD_AUDIT_CHUNKS,
            "Loaded chunks checked against the digest taken at store time (audit_loads).",
            ["result"],
            registry=r,
        )
        for result in AUDIT_RESULTS:
            self._load_audit.labels(result)
        self._load_decisions = Counter(
            names.LOAD_DECISIONS,
            "Hits on disk or in Redis loaded, recomputed as faster, or given up after waiting "
            "past the load's budget (load_policy: cost).",
            ["tier", "decision"],
            registry=r,
        )
        for t in LOAD_DECISION_TIERS:
            for decision in LOAD_DECISIONS:
                self._load_decisions.labels(t.value, decision)
        self._keys_stable = Gauge(
            names.KEYS_STABLE, "1 when chunk keys are stable across restarts.", registry=r
        )
        self._hybrid_manager_off = Gauge(
            names.HYBRID_MANAGER_OFF,
            "1 when the model has sliding-window/chunked-local layers and vLLM's hybrid KV cache "
            "manager is off because kvstore does not support it (those layers keep every token).",
            registry=r,
        )

    # -- lookups -----------------------------------------------------------------------------

    def record_lookup(
        self, num_chunks: int, num_tokens: int, hits_by_tier: Mapping[Tier, TierHits]
    ) -> None:
        """One lookup of `num_chunks` chunks (`num_tokens` tokens) and what each tier served."""
        _check_count("num_chunks", num_chunks)
        _check_count("num_tokens", num_tokens)
        self._lookups.inc()
        self._lookup_chunks.inc(num_chunks)
        self._lookup_tokens.inc(num_tokens)
        for tier, (chunks, tokens) in hits_by_tier.items():
            label = Tier(tier).value
            self._hit_chunks.labels(label).inc(chunks)
            self._hit_tokens.labels(label).inc(tokens)

    # -- placement -----------------------------------------------------------------------------

    def record_events(self, events: Sequence[TierEvent]) -> None:
        """Count stored, removed and evicted chunks per tier from the internal events."""
        for event in events:
            tier = Tier(event.tier).value
            n = len(event.keys)
            if isinstance(event, ChunkStored):
                self._stored.labels(tier).inc(n)
            elif isinstance(event, ChunkRemoved):
                reason = removal_reason(event.reason)
                self._removed.labels(tier, reason).inc(n)
                if reason == "evicted":
                    self._evicted.labels(tier).inc(n)

    # -- transfers -----------------------------------------------------------------------------

    def observe_transfer(
        self, direction: Direction, num_bytes: int, duration_s: float, ok: bool
    ) -> None:
        """One transfer finished here (in the scheduler process: CPU↔disk)."""
        _check_count("num_bytes", num_bytes)
        self._transfers.observe(Direction(direction), num_bytes, duration_s, ok)

    def record_transfer_stats(self, stats: TransferStats) -> None:
        """Merge a worker's accumulated transfers (engine↔CPU)."""
        self._transfers.add(stats)

    # -- occupancy -----------------------------------------------------------------------------

    def set_occupancy(self, tier: Tier, occupancy: Occupancy) -> None:
        self._occupancy.set(tier, occupancy)

    def set_occupancy_source(self, tier: Tier, source: OccupancySource | None) -> None:
        """Read `tier`'s occupancy at scrape time from `source` (None stops pulling)."""
        self._occupancy.set_source(tier, source)

    def set_store_source(self, source: Callable[[], StoreSnapshot | None] | None) -> None:
        """Read the disk store's file size and namespaces at scrape time (quick, thread-safe).

        Only those two: the disk tier's occupancy comes from `set_occupancy[_source]`.
        """
        self._store_source = source

    def set_pipeline_source(self, source: Callable[[], dict[str, int]] | None) -> None:
        """Read what the pipeline holds at scrape time (`PIPELINE_WHATS`; missing ones are 0)."""
        self._pipeline.set_source(source)

    def _read_store(self) -> StoreSnapshot | None:
        source = self._store_source
        if source is None:
            return None
        try:
            return source()
        except Exception:
            logger.warning("store source failed", exc_info=True)
            return None

    # -- queues and sinks ----------------------------------------------------------------------

    def set_tier_up(self, tier: Tier, is_up: bool) -> None:
        self._tier_up.labels(Tier(tier).value).set(1 if is_up else 0)

    def set_queue_depth(self, queue: QueueName, depth: int, capacity: int | None = None) -> None:
        label = QueueName(queue).value
        self._queue_depth.labels(label).set(depth)
        if capacity is not None:
            self._queue_capacity.labels(label).set(capacity)

    def record_queue_drop(self, queue: QueueName, n: int = 1, reason: str = "queue_full") -> None:
        _check_count("n", n)
        self._queue_dropped.labels(QueueName(queue).value, _drop_reason(reason)).inc(n)

    def add_sink(self, sink: str) -> None:
        """Create a sink's series (at zero). Sink names are fixed by code, never by data."""
        self._sink_written.labels(sink)
        self._sink_errors.labels(sink)
        for reason in DROP_REASONS:
            self._sink_dropped.labels(sink, reason)

    def record_sink_written(self, sink: str, num_events: int) -> None:
        self._sink_written.labels(sink).inc(num_events)

    def record_sink_drop(self, sink: str, num_events: int, reason: str = "queue_full") -> None:
        _check_count("num_events", num_events)
        self._sink_dropped.labels(sink, _drop_reason(reason)).inc(num_events)

    def record_sink_error(self, sink: str) -> None:
        self._sink_errors.labels(sink).inc()

    # -- errors --------------------------------------------------------------------------------

    def record_checksum_failure(self, tier: Tier, n: int = 1) -> None:
        self._checksum.labels(Tier(tier).value).inc(n)

    def record_io_error(self, op: IOOp, n: int = 1) -> None:
        self._io_errors.labels(IOOp(op).value).inc(n)

    def record_load_failure(self, num_chunks: int) -> None:
        """Chunks whose load failed and were reported to vLLM (which recomputes them)."""
        _check_count("num_chunks", num_chunks)
        self._load_failed.inc(num_chunks)

    def record_load_decision(self, tier: Tier, decision: str) -> None:
        """`load_policy: cost` loaded a hit from `tier`, or judged recomputing it faster."""
        self._load_decisions.labels(Tier(tier).value, decision).inc()

    def record_load_audit(self, counts: Mapping[str, int]) -> None:
        """Loaded chunks the workers' audit checked, by result (`AUDIT_RESULTS`)."""
        for result, num_chunks in counts.items():
            if result not in AUDIT_RESULTS:
                raise ValueError(f"unknown audit result {result!r}; allowed: {AUDIT_RESULTS}")
            _check_count("num_chunks", num_chunks)
            self._load_audit.labels(result).inc(num_chunks)

    # -- identity ------------------------------------------------------------------------------

    def set_key_stability(self, is_stable: bool) -> None:
        self._keys_stable.set(1 if is_stable else 0)

    def set_hybrid_manager_off(self, is_off: bool) -> None:
        self._hybrid_manager_off.set(1 if is_off else 0)

    def set_config_info(self, config: Mapping[str, object]) -> None:
        """Static configuration as `kvstore_config_info` labels (short scalar values only)."""
        self._config.info({key: str(value) for key, value in sorted(config.items())})


def _drop_reason(reason: str) -> str:
    if reason not in DROP_REASONS:
        raise ValueError(f"drop reason {reason!r} unknown; allowed: {', '.join(DROP_REASONS)}")
    return reason
