"""kvstore's counters on vLLM's own `/metrics` (`vllm:kvstore_*`), through the connector stats
channel of the installed vLLM: the scheduler-side connector hands per-step deltas to vLLM
(`get_kv_connector_stats`), vLLM's stat loggers aggregate them and feed `KVStorePromMetrics`.

The full set, with histograms and occupancy, stays on kvstore's own endpoint (`metrics_port`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from vllm.config import VllmConfig
from vllm.distributed.kv_transfer.kv_connector.v1.metrics import (
    KVConnectorPromMetrics,
    KVConnectorStats,
    PromMetric,
    PromMetricT,
)

from kvstore.events import ChunkRemoved, ChunkStored, TierEvent
from kvstore.keys import Tier

__all__ = ["KVStoreConnectorStats", "KVStorePromMetrics", "StepCounters"]

# stats key -> (vLLM metric name, documentation); keys ending in /<tier> carry a tier label
_METRICS: dict[str, tuple[str, str]] = {
    "lookup_tokens": ("vllm:kvstore_lookup_tokens", "Tokens kvstore was asked for."),
    "hit_tokens": ("vllm:kvstore_hit_tokens", "Tokens kvstore served, per tier."),
    "stored_chunks": ("vllm:kvstore_stored_chunks", "Chunks kvstore stored, per tier."),
    "evicted_chunks": ("vllm:kvstore_evicted_chunks", "Chunks kvstore evicted, per tier."),
    "load_failed_chunks": (
        "vllm:kvstore_load_failed_chunks",
        "Chunks whose load failed; vLLM recomputed them.",
    ),
}


class StepCounters:
    """What happened since vLLM last asked (the scheduler thread only)."""

    def __init__(self) -> None:
        self._counts: Counter[str] = Counter()

    def add(self, key: str, n: int) -> None:
        if n:
            self._counts[key] += n

    # -- kvstore.pipeline.PipelineObserver ---------------------------------------------------

    def record_lookup(
        self, num_chunks: int, num_tokens: int, hits_by_tier: Mapping[Tier, tuple[int, int]]
    ) -> None:
        self.add("lookup_tokens", num_tokens)
        for tier, (_, tokens) in hits_by_tier.items():
            self.add(f"hit_tokens/{Tier(tier).value}", tokens)

    def record_load_failure(self, num_chunks: int) -> None:
        self.add("load_failed_chunks", num_chunks)

    def record_events(self, events: Sequence[TierEvent]) -> None:
        self.add_events(events)

    def add_events(self, events: Sequence[TierEvent]) -> None:
        for event in events:
            tier = Tier(event.tier).value
            if isinstance(event, ChunkStored):
                self._counts[f"stored_chunks/{tier}"] += len(event.keys)
            elif isinstance(event, ChunkRemoved) and event.reason == "evicted":
                self._counts[f"evicted_chunks/{tier}"] += len(event.keys)

    def take(self) -> KVStoreConnectorStats | None:
        if not self._counts:
            return None
        stats = KVStoreConnectorStats(data=dict(self._counts))
        self._counts = Counter()
        return stats


@dataclass
class KVStoreConnectorStats(KVConnectorStats):
    """Counter deltas keyed like `hit_tokens/cpu`; aggregation sums them."""

    def reset(self) -> None:
        self.data = {}

    def aggregate(self, other: KVConnectorStats) -> KVConnectorStats:
        merged: Counter[str] = Counter(self.data)
        merged.update(other.data)
        self.data = dict(merged)
        return self

    def reduce(self) -> dict[str, int | float]:
        return {key: value for key, value in sorted(self.data.items())}

    def is_empty(self) -> bool:
        return not any(self.data.values())


class KVStorePromMetrics(KVConnectorPromMetrics):
    """`vllm:kvstore_*_total` counters with vLLM's engine labels (plus `tier` where it applies)."""

    def __init__(
        self,
        vllm_config: VllmConfig,
        metric_types: dict[type[PromMetric], type[PromMetricT]],
        labelnames: list[str],
        per_engine_labelvalues: dict[int, list[object]],
    ) -> None:
        super().__init__(vllm_config, metric_types, labelnames, per_engine_labelvalues)
        self._children: dict[tuple[int, str], Any] = {}
        tiered = ("hit_tokens", "stored_chunks", "evicted_chunks")
        for key, (name, doc) in _METRICS.items():
            extra = ["tier"] if key in tiered else []
            metric = self._counter_cls(name=name, documentation=doc, labelnames=labelnames + extra)
            for engine_idx, values in per_engine_labelvalues.items():
                if extra:
                    for tier in Tier:
                        child = metric.labels(*values, tier.value)
                        self._children[(engine_idx, f"{key}/{tier.value}")] = child
                else:
                    self._children[(engine_idx, key)] = metric.labels(*values)

    def observe(self, transfer_stats_data: dict[str, Any], engine_idx: int = 0) -> None:
        for key, value in transfer_stats_data.items():
            child = self._children.get((engine_idx, key))
            if child is not None and value:
                child.inc(value)
