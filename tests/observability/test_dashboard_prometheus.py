"""Every dashboard query returns data from a real Prometheus scraping real exporters.

A traffic thread records what a busy engine would (lookups hitting both tiers, transfers in every
direction, stores, evictions, removals, drops, errors) through the real `KVStoreMetrics`, the real
event bus and a real LMDB store; `kvstore serve` exports a second target beside it.
"""

from __future__ import annotations

import asyncio
import math
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from kvstore.cli.serve import serve_store
from kvstore.eventbus import EventBus, EventSink, JSONLSink, MemorySink
from kvstore.events import ChunkRemoved, ChunkStored, TierEvent
from kvstore.keys import BlockKey, Tier
from kvstore.metrics import (
    Direction,
    IOOp,
    KVStoreMetrics,
    Occupancy,
    QueueName,
    TransferStatsAccumulator,
    start_metrics_server,
    store_snapshot,
)
from tests.support.prometheus import evaluate_dashboard, run_prometheus
from tiers.lmdb import LMDBStore

pytestmark = pytest.mark.prometheus

ROW_BYTES = 64 << 10
TICK_S = 0.1


class SlowSink:
    """A sink slower than the traffic: its queue fills and the bus drops for it."""

    name = "slow"

    async def start(self) -> None:
        pass

    async def write(self, batch: Sequence[TierEvent]) -> None:
        await asyncio.sleep(1.0)

    async def close(self) -> None:
        pass


@dataclass
class Engine:
    """What the scheduler process owns, minus vLLM: metrics, bus (on its loop thread), store."""

    metrics: KVStoreMetrics
    bus: EventBus
    loop: asyncio.AbstractEventLoop
    store: LMDBStore


def tick(engine: Engine, worker: TransferStatsAccumulator, i: int) -> None:
    m = engine.metrics
    m.record_lookup(8, 8 * 16, {Tier.CPU: (3, 48), Tier.DISK: (2, 32)})
    keys = tuple(BlockKey(bytes([i % 256, j]) * 16) for j in range(2))
    engine.store.put_many("ns", [(k, bytes(ROW_BYTES)) for k in keys])
    events: list[TierEvent] = [
        ChunkStored(Tier.CPU, keys, 16, float(i)),
        ChunkStored(Tier.DISK, keys, 16, float(i)),
        ChunkRemoved(Tier.CPU, keys[:1], float(i), reason="evicted"),
        ChunkRemoved(Tier.DISK, keys[1:], float(i), reason="evicted" if i % 2 else "deleted"),
    ]
    m.record_events(events)  # as the scheduler does with the index's take_events()
    engine.bus.publish_threadsafe(events)
    # worker side: engine <-> CPU, merged by the scheduler once per step
    for j in range(4):
        worker.observe(Direction.ENGINE_TO_CPU, 2 * ROW_BYTES, 0.0002 * (j + 1), ok=True)
        worker.observe(Direction.CPU_TO_ENGINE, ROW_BYTES, 0.0004 * (j + 1), ok=j != 3)
    m.record_transfer_stats(worker.take())
    # scheduler side: CPU <-> disk
    m.observe_transfer(Direction.CPU_TO_DISK, 2 * ROW_BYTES, 0.004, ok=True)
    m.observe_transfer(Direction.DISK_TO_CPU, ROW_BYTES, 0.002 + 0.001 * (i % 3), ok=i % 5 != 0)
    m.set_occupancy(Tier.CPU, Occupancy(ROW_BYTES * (i % 64), ROW_BYTES * 64, i % 64, i % 64, 64))
    m.set_queue_depth(QueueName.WRITE_THROUGH, i % 7, capacity=64)
    m.set_queue_depth(QueueName.PROMOTION, i % 3, capacity=64)
    m.record_queue_drop(QueueName.WRITE_THROUGH, 1)
    m.record_checksum_failure(Tier.DISK)
    m.record_io_error(IOOp.READ)
    m.record_load_failure(1)
    # the remote tier: round trips per node, a breaker that opens and closes, transfers
    for op in ("exists", "get", "put"):
        m.remote.round_trip(op, "127.0.0.1:7000", 2, ROW_BYTES, 0.0005 * (1 + i % 4), ok=True)
    m.remote.round_trip("get", "127.0.0.1:7001", 2, 0, 0.5, ok=i % 3 != 0)
    m.remote.breaker_changed("127.0.0.1:7001", 2 if i % 3 == 0 else 0)
    m.observe_transfer(Direction.REMOTE_TO_CPU, ROW_BYTES, 0.001, ok=True)
    m.observe_transfer(Direction.CPU_TO_REMOTE, ROW_BYTES, 0.002, ok=True)


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[Engine]:
    metrics = KVStoreMetrics(CollectorRegistry())
    metrics.set_key_stability(True)
    store = LMDBStore.open(tmp_path / "store", capacity_bytes=256 << 20)
    store.register_namespace("ns", {"model": "tiny"})
    metrics.set_store_source(lambda: store_snapshot(store))

    def disk_occupancy() -> Occupancy:
        snap = store_snapshot(store)
        return Occupancy(snap.used_bytes, snap.capacity_bytes, snap.num_entries)

    metrics.set_occupancy_source(Tier.DISK, disk_occupancy)
    sinks: list[EventSink] = [MemorySink("vllm"), JSONLSink(tmp_path / "events.jsonl"), SlowSink()]
    bus = EventBus(sinks, metrics=metrics, max_queued_batches=2)
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="tier-service-loop")
    thread.start()
    try:
        asyncio.run_coroutine_threadsafe(bus.start(), loop).result(10)
        yield Engine(metrics, bus, loop, store)
    finally:
        asyncio.run_coroutine_threadsafe(bus.close(deadline_s=1.0), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()
        store.close()


@pytest.fixture
def traffic(engine: Engine) -> Iterator[Engine]:
    stop = threading.Event()
    worker = TransferStatsAccumulator()

    def run() -> None:
        i = 0
        while not stop.wait(TICK_S):
            tick(engine, worker, i)
            i += 1

    thread = threading.Thread(target=run, name="traffic")
    thread.start()
    try:
        yield engine
    finally:
        stop.set()
        thread.join(10)


def test_every_dashboard_query_returns_data(
    prometheus_binary: Path, traffic: Engine, tmp_path: Path
) -> None:
    exporter = start_metrics_server(0, registry=traffic.metrics.registry)
    serve = serve_store(traffic.store.path, port=0)
    try:
        with run_prometheus(
            [exporter.target, serve.server.target], binary=prometheus_binary
        ) as prom:
            prom.wait_for_scrapes(2, timeout_s=60)
            checks = evaluate_dashboard(prom)
            up = prom.query("up")
            hit_ratio = prom.query(
                "sum(rate(kvstore_hit_tokens_total[30s]))"
                " / sum(rate(kvstore_lookup_tokens_total[30s]))"
            )
    finally:
        serve.close()
        exporter.close()
    assert sorted(float(s["value"][1]) for s in up) == [1.0, 1.0]
    bad = [c for c in checks if not c.is_ok]
    assert not bad, "\n".join(
        f"{c.expr}: {c.num_series} series, {c.num_finite} finite, {c.error}" for c in bad
    )
    assert len(checks) >= 20
    ratio = float(hit_ratio[0]["value"][1])
    assert math.isclose(ratio, 80 / 128, rel_tol=1e-6)
