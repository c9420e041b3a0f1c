"""KVStoreMetrics on a fresh registry: names, initialised series, recording, the exporter."""

from __future__ import annotations

import ast
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from kvstore.events import ChunkRemoved, ChunkStored
from kvstore.keys import BlockKey, Tier
from kvstore.metrics import (
    METRIC_NAMES,
    SERVE_METRIC_NAMES,
    Direction,
    IOOp,
    KVStoreMetrics,
    Occupancy,
    QueueName,
    StoreCollector,
    StoreSnapshot,
    TransferStatsAccumulator,
    start_metrics_server,
)
from kvstore.metrics import names as n

SUFFIXES = ("_bucket", "_count", "_sum", "_created")


@pytest.fixture
def metrics() -> KVStoreMetrics:
    return KVStoreMetrics(CollectorRegistry())


def value(m: KVStoreMetrics, name: str, **labels: str) -> float:
    v = m.registry.get_sample_value(name, labels)
    assert v is not None, f"no sample {name}{labels}"
    return v


def exported_names(registry: CollectorRegistry) -> set[str]:
    """Metric names as on the wire (counters with _total), without histogram/created suffixes."""
    out: set[str] = set()
    for family in registry.collect():
        for sample in family.samples:
            name = sample.name
            for suffix in SUFFIXES:
                if name.endswith(suffix) and name.removesuffix(suffix) == family.name:
                    name = family.name
            if family.type == "counter" and not name.endswith("_total"):
                continue  # _created
            out.add(name)
    return out


def key(i: int) -> BlockKey:
    return BlockKey(i.to_bytes(32, "big"))


def test_a_fresh_registry_exports_exactly_the_declared_names(metrics: KVStoreMetrics) -> None:
    assert exported_names(metrics.registry) == set(METRIC_NAMES)
    serve = CollectorRegistry()
    serve.register(StoreCollector(lambda: StoreSnapshot(1, 2, 3, 4, 5)))
    assert exported_names(serve) <= set(SERVE_METRIC_NAMES)
    assert len(METRIC_NAMES) == len(set(METRIC_NAMES))


def test_names_follow_prometheus_conventions(metrics: KVStoreMetrics) -> None:
    for name in METRIC_NAMES:
        assert name.startswith("kvstore_"), name
    allowed_labels = {
        "tier", "direction", "result", "op", "reason", "queue", "sink", "state", "what", "le",
        "decision",
    }
    for family in metrics.registry.collect():
        if family.type == "counter":
            assert all(s.name.endswith(("_total", "_created")) for s in family.samples)
        if family.type == "info":
            continue
        for sample in family.samples:
            assert set(sample.labels) <= allowed_labels, (family.name, sample.labels)


def test_every_labelled_series_exists_from_the_start(metrics: KVStoreMetrics) -> None:
    for tier in Tier:
        for name in (n.HIT_CHUNKS, n.HIT_TOKENS, n.STORED_CHUNKS, n.EVICTED_CHUNKS):
            assert value(metrics, name, tier=tier.value) == 0
        assert value(metrics, n.REMOVED_CHUNKS, tier=tier.value, reason="evicted") == 0
        assert value(metrics, n.TIER_USED_BYTES, tier=tier.value) == 0
        assert value(metrics, n.CHECKSUM_FAILURES, tier=tier.value) == 0
    for direction in Direction:
        assert value(metrics, n.TRANSFERS, direction=direction.value, result="error") == 0
        assert value(metrics, n.TRANSFER_BYTES, direction=direction.value) == 0
        count = n.TRANSFER_DURATION_SECONDS + "_count"
        assert value(metrics, count, direction=direction.value) == 0
    for queue in QueueName:
        assert value(metrics, n.QUEUE_DEPTH, queue=queue.value) == 0
        assert value(metrics, n.QUEUE_DROPPED, queue=queue.value, reason="queue_full") == 0
    for op in IOOp:
        assert value(metrics, n.IO_ERRORS, op=op.value) == 0
    assert value(metrics, n.LOAD_FAILED_CHUNKS) == 0
    assert value(metrics, n.BUILD_INFO, version="0.1.0", python_version=sys.version.split()[0])


def test_lookups_count_chunks_and_tokens_per_tier(metrics: KVStoreMetrics) -> None:
    metrics.record_lookup(8, 512, {Tier.CPU: (3, 192), Tier.DISK: (2, 128)})
    metrics.record_lookup(4, 256, {})
    assert value(metrics, n.LOOKUPS) == 2
    assert value(metrics, n.LOOKUP_CHUNKS) == 12
    assert value(metrics, n.LOOKUP_TOKENS) == 768
    assert value(metrics, n.HIT_CHUNKS, tier="cpu") == 3
    assert value(metrics, n.HIT_TOKENS, tier="disk") == 128
    with pytest.raises(ValueError, match="num_tokens"):
        metrics.record_lookup(1, -1, {})


def test_events_count_stored_removed_and_evicted(metrics: KVStoreMetrics) -> None:
    metrics.record_events(
        [
            ChunkStored(Tier.CPU, (key(1), key(2)), 16, 0.0),
            ChunkStored(Tier.DISK, (key(1),), 16, 0.0),
            ChunkRemoved(Tier.CPU, (key(1),), 0.0, reason="evicted"),
            ChunkRemoved(Tier.DISK, (key(1),), 0.0, reason="corrupt"),
            ChunkRemoved(Tier.DISK, (key(2),), 0.0, reason="something new"),
        ]
    )
    assert value(metrics, n.STORED_CHUNKS, tier="cpu") == 2
    assert value(metrics, n.STORED_CHUNKS, tier="disk") == 1
    assert value(metrics, n.EVICTED_CHUNKS, tier="cpu") == 1
    assert value(metrics, n.EVICTED_CHUNKS, tier="disk") == 0
    assert value(metrics, n.REMOVED_CHUNKS, tier="disk", reason="corrupt") == 1
    assert value(metrics, n.REMOVED_CHUNKS, tier="disk", reason="other") == 1


def test_transfers_fill_histograms_and_count_failures(metrics: KVStoreMetrics) -> None:
    metrics.observe_transfer(Direction.CPU_TO_DISK, 1 << 20, 0.003, ok=True)
    metrics.observe_transfer(Direction.CPU_TO_DISK, 1 << 20, 0.0002, ok=True)
    metrics.observe_transfer(Direction.CPU_TO_DISK, 1 << 20, 0.5, ok=False)
    d = {"direction": "cpu_to_disk"}
    assert value(metrics, n.TRANSFERS, result="ok", **d) == 2
    assert value(metrics, n.TRANSFERS, result="error", **d) == 1
    assert value(metrics, n.TRANSFER_BYTES, **d) == 2 << 20
    hist = n.TRANSFER_DURATION_SECONDS
    assert value(metrics, hist + "_bucket", le="0.00025", **d) == 1
    assert value(metrics, hist + "_bucket", le="0.005", **d) == 2
    assert value(metrics, hist + "_bucket", le="+Inf", **d) == 2
    assert value(metrics, hist + "_count", **d) == 2
    assert value(metrics, hist + "_sum", **d) == pytest.approx(0.0032)
    assert value(metrics, n.TRANSFER_SIZE_BYTES + "_bucket", le="1.048576e+06", **d) == 2


def test_worker_stats_merge_like_local_observations(metrics: KVStoreMetrics) -> None:
    local = KVStoreMetrics(CollectorRegistry())
    workers = [TransferStatsAccumulator(), TransferStatsAccumulator()]
    samples = [(Direction.ENGINE_TO_CPU, 4096 * i, 0.0001 * i, i % 5 != 0) for i in range(1, 40)]
    for i, (direction, size, duration, ok) in enumerate(samples):
        workers[i % 2].observe(direction, size, duration, ok)
        local.observe_transfer(direction, size, duration, ok)
    for worker in workers:
        metrics.record_transfer_stats(worker.take())
        assert worker.take().is_empty
    for family in ("kvstore_transfer_duration_seconds", "kvstore_transfer_size_bytes"):
        for sample in next(f for f in local.registry.collect() if f.name == family).samples:
            assert value(metrics, sample.name, **sample.labels) == pytest.approx(sample.value)


def test_occupancy_push_and_pull(metrics: KVStoreMetrics) -> None:
    metrics.set_occupancy(Tier.CPU, Occupancy(100, 1000, 3, used_rows=3, capacity_rows=30))
    assert value(metrics, n.TIER_USED_BYTES, tier="cpu") == 100
    assert value(metrics, n.CPU_CAPACITY_ROWS) == 30
    calls = []

    def disk() -> Occupancy:
        calls.append(1)
        if len(calls) > 1:
            raise OSError("store went away")
        return Occupancy(5, 50, 1)

    metrics.set_occupancy_source(Tier.DISK, disk)
    assert value(metrics, n.TIER_CAPACITY_BYTES, tier="disk") == 50
    # a failing source exports its last good value
    assert value(metrics, n.TIER_ENTRIES, tier="disk") == 1


def test_queues_sinks_errors_and_identity(metrics: KVStoreMetrics) -> None:
    metrics.set_queue_depth(QueueName.WRITE_THROUGH, 7, capacity=64)
    metrics.record_queue_drop(QueueName.WRITE_THROUGH, 2)
    assert value(metrics, n.SINK_DROPPED_EVENTS, sink="zmq", reason="queue_full") == 0
    assert value(metrics, n.SINK_ERRORS, sink="jsonl") == 0
    metrics.add_sink("memory")
    assert value(metrics, n.SINK_WRITTEN_EVENTS, sink="memory") == 0
    metrics.record_sink_drop("zmq", 5)
    metrics.record_checksum_failure(Tier.DISK)
    metrics.record_io_error(IOOp.WRITE)
    metrics.record_load_failure(3)
    metrics.set_key_stability(True)
    assert value(metrics, n.STORE_NAMESPACES) == 0
    metrics.set_store_source(lambda: StoreSnapshot(1, 2, 3, file_bytes=4096, num_namespaces=2))
    metrics.set_config_info({"eviction_policy": "lru", "cpu_bytes": 1 << 30})
    assert value(metrics, n.QUEUE_DEPTH, queue="write_through") == 7
    assert value(metrics, n.QUEUE_CAPACITY, queue="write_through") == 64
    assert value(metrics, n.QUEUE_DROPPED, queue="write_through", reason="queue_full") == 2
    assert value(metrics, n.SINK_DROPPED_EVENTS, sink="zmq", reason="queue_full") == 5
    assert value(metrics, n.CHECKSUM_FAILURES, tier="disk") == 1
    assert value(metrics, n.IO_ERRORS, op="write") == 1
    assert value(metrics, n.LOAD_FAILED_CHUNKS) == 3
    assert value(metrics, n.KEYS_STABLE) == 1
    assert value(metrics, n.STORE_FILE_BYTES) == 4096
    assert value(metrics, n.STORE_NAMESPACES) == 2
    assert value(metrics, n.CONFIG_INFO, eviction_policy="lru", cpu_bytes=str(1 << 30)) == 1
    with pytest.raises(ValueError, match="bogus"):
        metrics.set_queue_depth("bogus", 1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="allowed"):
        metrics.record_queue_drop(QueueName.EVENTS, 1, reason="because")


def test_exporter_serves_the_registry_and_closes(metrics: KVStoreMetrics) -> None:
    metrics.record_lookup(2, 64, {Tier.CPU: (1, 32)})
    server = start_metrics_server(0, registry=metrics.registry)
    with server:
        with urllib.request.urlopen(server.url, timeout=5) as response:
            text = response.read().decode()
        families = {f.name for f in text_string_to_metric_families(text)}
        assert "kvstore_hit_tokens" in families
        assert 'kvstore_hit_tokens_total{tier="cpu"} 32.0' in text
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(server.url, timeout=2)


def test_observability_packages_do_not_import_vllm() -> None:
    code = (
        "import sys, kvstore.metrics, kvstore.eventbus;"
        "bad = sorted(m for m in sys.modules if m == 'vllm' or m.startswith('vllm.'));"
        "print(bad); sys.exit(1 if bad else 0)"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], check=False, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_observability_sources_never_import_vllm() -> None:
    root = Path(__file__).resolve().parents[2]
    files = [
        *(root / "kvstore" / "metrics").glob("*.py"),
        *(root / "kvstore" / "eventbus").glob("*.py"),
        root / "kvstore" / "cli" / "watch.py",
        root / "kvstore" / "cli" / "serve.py",
        root / "tests" / "support" / "prometheus.py",
    ]
    for file in files:
        for node in ast.walk(ast.parse(file.read_text())):
            if isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                modules = [node.module or ""]
            else:
                continue
            assert not any(m == "vllm" or m.startswith("vllm.") for m in modules), file
