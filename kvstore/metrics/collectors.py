"""Custom collectors: transfers (mergeable bucket counts), tier occupancy, and the store file.

Each reads its state under a lock at scrape time; pull sources are called once per scrape.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from itertools import accumulate

from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from kvstore.keys import Tier
from kvstore.metrics import names
from kvstore.metrics.labels import (
    DURATION_BUCKETS_S,
    SIZE_BUCKETS_BYTES,
    TIERS,
    Direction,
    TransferResult,
)
from kvstore.metrics.stats import DirectionStats, TransferStats, TransferStatsAccumulator
from kvstore.occupancy import Occupancy
from tiers.store import BlockStore

__all__ = [
    "Occupancy",
    "OccupancyCollector",
    "OccupancySource",
    "PIPELINE_WHATS",
    "PipelineCollector",
    "StoreCollector",
    "StoreSnapshot",
    "TransferCollector",
]

logger = logging.getLogger(__name__)


OccupancySource = Callable[[], Occupancy]
"""Called at scrape time (from the exporter's thread): must be quick and thread-safe."""


_float_to_go_string: Callable[[float], str] = floatToGoString  # untyped upstream


def _le(bound: float) -> str:
    """A bucket bound as prometheus-client's own histograms write `le`."""
    return _float_to_go_string(bound)


def _histogram(
    name: str, doc: str, bounds: Iterable[float], per_direction: dict[Direction, DirectionStats]
) -> HistogramMetricFamily:
    les = [_le(b) for b in bounds] + ["+Inf"]
    family = HistogramMetricFamily(name, doc, labels=["direction"])
    for direction in Direction:
        stats = per_direction.get(direction, DirectionStats())
        if name == names.TRANSFER_DURATION_SECONDS:
            counts, total = stats.duration_buckets, stats.duration_sum_s
        else:
            counts, total = stats.size_buckets, float(stats.num_bytes)
        cumulative = list(accumulate(counts))
        family.add_metric(
            [direction.value],
            buckets=list(zip(les, (float(c) for c in cumulative), strict=True)),
            sum_value=total,
        )
    return family


class TransferCollector(Collector):
    """Transfers per direction: counts by result, bytes, and duration and size histograms.

    Fed with single transfers (`observe`) and with workers' stats (`add`).
    """

    def __init__(self) -> None:
        self._total = TransferStatsAccumulator()

    def observe(self, direction: Direction, num_bytes: int, duration_s: float, ok: bool) -> None:
        self._total.observe(direction, num_bytes, duration_s, ok)

    def add(self, stats: TransferStats) -> None:
        self._total.add(stats)

    def snapshot(self) -> TransferStats:
        return self._total.snapshot()

    def describe(self) -> Iterable[Metric]:
        return self._families(TransferStats())

    def collect(self) -> Iterable[Metric]:
        return self._families(self.snapshot())

    @staticmethod
    def _families(total: TransferStats) -> Iterator[Metric]:
        per = dict(total.by_direction)
        transfers = CounterMetricFamily(
            names.TRANSFERS,
            "Transfers finished, by direction and result.",
            labels=["direction", "result"],
        )
        moved = CounterMetricFamily(
            names.TRANSFER_BYTES, "Bytes moved by successful transfers.", labels=["direction"]
        )
        for direction in Direction:
            stats = per.get(direction, DirectionStats())
            transfers.add_metric([direction.value, TransferResult.OK.value], stats.num_ok)
            transfers.add_metric([direction.value, TransferResult.ERROR.value], stats.num_failed)
            moved.add_metric([direction.value], stats.num_bytes)
        yield transfers
        yield moved
        yield _histogram(
            names.TRANSFER_DURATION_SECONDS,
            "Duration of successful transfers.",
            DURATION_BUCKETS_S,
            per,
        )
        yield _histogram(
            names.TRANSFER_SIZE_BYTES, "Size of successful transfers.", SIZE_BUCKETS_BYTES, per
        )


class OccupancyCollector(Collector):
    """Used and capacity bytes and entries per tier (and the CPU region's rows).

    Each tier is either pushed (`set`) or pulled at scrape time (`set_source`); a failing source
    is logged and its last good value is exported.
    """

    def __init__(self, tiers: Iterable[Tier] = TIERS, *, include_rows: bool = True) -> None:
        self._lock = threading.Lock()
        self._tiers = tuple(tiers)
        self._include_rows = include_rows
        self._values: dict[Tier, Occupancy] = {tier: Occupancy() for tier in self._tiers}
        self._sources: dict[Tier, OccupancySource] = {}

    def set(self, tier: Tier, occupancy: Occupancy) -> None:
        with self._lock:
            self._values[Tier(tier)] = occupancy

    def set_source(self, tier: Tier, source: OccupancySource | None) -> None:
        with self._lock:
            if source is None:
                self._sources.pop(Tier(tier), None)
            else:
                self._sources[Tier(tier)] = source

    def _read(self) -> dict[Tier, Occupancy]:
        with self._lock:
            sources = dict(self._sources)
        pulled: dict[Tier, Occupancy] = {}
        for tier, source in sources.items():
            try:
                pulled[tier] = source()
            except Exception:
                logger.warning("occupancy source for tier %s failed", tier.value, exc_info=True)
        with self._lock:
            self._values.update(pulled)
            return dict(self._values)

    def describe(self) -> Iterable[Metric]:
        return self._families({tier: Occupancy() for tier in self._tiers})

    def collect(self) -> Iterable[Metric]:
        return self._families(self._read())

    def _families(self, values: dict[Tier, Occupancy]) -> Iterator[Metric]:
        used = GaugeMetricFamily(names.TIER_USED_BYTES, "Bytes held by a tier.", labels=["tier"])
        cap = GaugeMetricFamily(
            names.TIER_CAPACITY_BYTES, "Capacity of a tier in bytes.", labels=["tier"]
        )
        entries = GaugeMetricFamily(names.TIER_ENTRIES, "Chunks held by a tier.", labels=["tier"])
        for tier in self._tiers:
            occ = values[tier]
            used.add_metric([tier.value], occ.used_bytes)
            cap.add_metric([tier.value], occ.capacity_bytes)
            entries.add_metric([tier.value], occ.num_entries)
        yield from (used, cap, entries)
        if self._include_rows:
            cpu = values.get(Tier.CPU, Occupancy())
            yield GaugeMetricFamily(
                names.CPU_USED_ROWS, "CPU region rows in use.", value=cpu.used_rows or 0
            )
            yield GaugeMetricFamily(
                names.CPU_CAPACITY_ROWS, "CPU region rows in all.", value=cpu.capacity_rows or 0
            )


@dataclass(frozen=True, slots=True)
class StoreSnapshot:
    """What `kvstore serve` reports about a store, read in one short read transaction."""

    num_entries: int
    used_bytes: int
    capacity_bytes: int
    file_bytes: int
    num_namespaces: int


def store_snapshot(store: BlockStore) -> StoreSnapshot:
    """A store's occupancy, file size and namespaces from one `stats()` read."""
    stats = store.stats()
    return StoreSnapshot(
        num_entries=stats.num_entries,
        used_bytes=stats.used_bytes,
        capacity_bytes=stats.capacity_bytes,
        file_bytes=stats.file_bytes,
        num_namespaces=len(stats.namespaces),
    )


class StoreCollector(Collector):
    """A store's file size and namespaces (and, for `kvstore serve`, the disk tier's occupancy),
    read at scrape time. `read` returning None exports zeros (no store yet)."""

    def __init__(
        self, read: Callable[[], StoreSnapshot | None], *, include_occupancy: bool = True
    ) -> None:
        self._read = read
        self._include_occupancy = include_occupancy

    def describe(self) -> Iterable[Metric]:
        return self._families(_NO_STORE)

    def collect(self) -> Iterable[Metric]:
        return self._families(self._read() or _NO_STORE)

    def _families(self, snap: StoreSnapshot) -> Iterator[Metric]:
        disk = [Tier.DISK.value]
        if self._include_occupancy:
            for name, doc, value in (
                (names.TIER_USED_BYTES, "Bytes held by a tier.", snap.used_bytes),
                (names.TIER_CAPACITY_BYTES, "Capacity of a tier in bytes.", snap.capacity_bytes),
                (names.TIER_ENTRIES, "Chunks held by a tier.", snap.num_entries),
            ):
                family = GaugeMetricFamily(name, doc, labels=["tier"])
                family.add_metric(disk, value)
                yield family
        yield GaugeMetricFamily(
            names.STORE_FILE_BYTES, "Size of the store's data file.", value=snap.file_bytes
        )
        yield GaugeMetricFamily(
            names.STORE_NAMESPACES, "Namespaces in the store.", value=snap.num_namespaces
        )


_NO_STORE = StoreSnapshot(0, 0, 0, 0, 0)


PIPELINE_WHATS = ("cpu_pins", "disk_pins", "holds", "promoting", "jobs", "tracked_requests")
"""The `what` label of `kvstore_pipeline_inflight`: what the pipeline holds right now."""


class PipelineCollector(Collector):
    """What the pipeline holds (pins, holds, promotions, jobs, tracked requests), read at scrape
    time. Each returns to 0 when the engine is idle; a steady climb is a leak."""

    def __init__(self) -> None:
        self._source: Callable[[], dict[str, int]] | None = None

    def set_source(self, source: Callable[[], dict[str, int]] | None) -> None:
        self._source = source

    def describe(self) -> Iterable[Metric]:
        return self._families({})

    def collect(self) -> Iterable[Metric]:
        source = self._source
        values: dict[str, int] = {}
        if source is not None:
            try:
                values = source()
            except Exception:
                logger.warning("pipeline source failed", exc_info=True)
        return self._families(values)

    @staticmethod
    def _families(values: dict[str, int]) -> Iterator[Metric]:
        family = GaugeMetricFamily(
            names.PIPELINE_INFLIGHT, "What the pipeline holds right now.", labels=["what"]
        )
        for what in PIPELINE_WHATS:
            family.add_metric([what], values.get(what, 0))
        yield family
