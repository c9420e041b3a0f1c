"""kvstore's Prometheus metrics: the recording API, the worker-side stats and the exporter.

    metrics = KVStoreMetrics(CollectorRegistry())
    metrics.record_lookup(num_chunks=4, num_tokens=256, hits_by_tier={Tier.CPU: (2, 128)})
    server = start_metrics_server(9400, registry=metrics.registry)
    ...
    server.close()

Names follow Prometheus conventions (`kvstore_` prefix, base units, `_total` counters, bounded
labels); `METRIC_NAMES` lists every one.
"""

from __future__ import annotations

from kvstore.metrics.collectors import (
    Occupancy,
    OccupancySource,
    StoreCollector,
    StoreSnapshot,
    store_snapshot,
)
from kvstore.metrics.labels import (
    AUDIT_RESULTS,
    DURATION_BUCKETS_S,
    SIZE_BUCKETS_BYTES,
    Direction,
    IOOp,
    QueueName,
)
from kvstore.metrics.names import METRIC_NAMES, SERVE_METRIC_NAMES
from kvstore.metrics.recorder import KVStoreMetrics, register_build_info
from kvstore.metrics.server import MetricsServer, serve_configured_metrics, start_metrics_server
from kvstore.metrics.stats import (
    DirectionStats,
    StatsFormatError,
    TransferStats,
    TransferStatsAccumulator,
)

__all__ = [
    "AUDIT_RESULTS",
    "DURATION_BUCKETS_S",
    "Direction",
    "DirectionStats",
    "IOOp",
    "KVStoreMetrics",
    "METRIC_NAMES",
    "MetricsServer",
    "Occupancy",
    "OccupancySource",
    "QueueName",
    "SERVE_METRIC_NAMES",
    "SIZE_BUCKETS_BYTES",
    "StatsFormatError",
    "StoreCollector",
    "StoreSnapshot",
    "TransferStats",
    "TransferStatsAccumulator",
    "register_build_info",
    "serve_configured_metrics",
    "start_metrics_server",
    "store_snapshot",
]
