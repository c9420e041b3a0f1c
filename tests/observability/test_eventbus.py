"""EventBus: fan-out in order, bounded per-sink queues, drops counted, ordered close."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Sequence

import pytest
from prometheus_client import CollectorRegistry

from kvstore.errors import ConfigError
from kvstore.eventbus import EventBus, EventSink, MemorySink
from kvstore.events import ChunkRemoved, ChunkStored, TierEvent
from kvstore.keys import BlockKey, Tier
from kvstore.metrics import KVStoreMetrics


def stored(i: int, tier: Tier = Tier.CPU) -> ChunkStored:
    return ChunkStored(tier, (BlockKey(i.to_bytes(8, "big")),), 16, float(i))


class SlowSink:
    """Sleeps in every write; records the order in which it was closed."""

    def __init__(self, name: str, delay_s: float, closed: list[str] | None = None) -> None:
        self._name = name
        self.delay_s = delay_s
        self.written: list[TierEvent] = []
        self.closed = closed if closed is not None else []

    @property
    def name(self) -> str:
        return self._name

    async def start(self) -> None:
        pass

    async def write(self, batch: Sequence[TierEvent]) -> None:
        await asyncio.sleep(self.delay_s)
        self.written.extend(batch)

    async def close(self) -> None:
        self.closed.append(self._name)


class FlakySink(SlowSink):
    async def write(self, batch: Sequence[TierEvent]) -> None:
        if any(e.ts_s == 1.0 for e in batch):
            raise OSError("disk full")
        self.written.extend(batch)


def test_sinks_satisfy_the_protocol() -> None:
    assert isinstance(MemorySink(), EventSink)
    assert isinstance(SlowSink("s", 0), EventSink)


async def test_events_reach_every_sink_in_order_and_only_sink_work_is_counted() -> None:
    metrics = KVStoreMetrics(CollectorRegistry())
    a, b = MemorySink("a"), MemorySink("b")
    bus = EventBus([a, b], metrics=metrics)
    await bus.start()
    for i in range(50):
        bus.publish([stored(i), ChunkRemoved(Tier.CPU, stored(i).keys, float(i))])
    assert await bus.close() == []
    assert a.take() == b.snapshot()
    assert [e.ts_s for e in b.take()] == [float(i // 2) for i in range(100)]
    reg = metrics.registry
    # the events are counted where they are taken from the index, not again by the bus
    assert reg.get_sample_value("kvstore_stored_chunks_total", {"tier": "cpu"}) == 0
    assert reg.get_sample_value("kvstore_sink_written_events_total", {"sink": "a"}) == 100
    assert a.is_closed and b.is_closed


async def test_a_slow_sink_never_stalls_publish_and_its_drops_are_counted() -> None:
    metrics = KVStoreMetrics(CollectorRegistry())
    slow, fast = SlowSink("slow", delay_s=0.05), MemorySink("fast")
    bus = EventBus([slow, fast], metrics=metrics, max_queued_batches=4)
    await bus.start()
    started = time.perf_counter()
    for i in range(2000):
        bus.publish([stored(i)])
        if i % 100 == 0:
            await asyncio.sleep(0)  # let the fast sink drain, as a real loop would
    publish_s = time.perf_counter() - started
    assert publish_s < 1.0, f"publish stalled: {publish_s:.2f} s for 2000 batches"
    await bus.close(deadline_s=2.0)
    stats = bus.sink_stats("slow")
    assert stats.num_dropped_batches > 1000
    assert stats.num_written_events + stats.num_dropped_events == 2000
    assert len(slow.written) == stats.num_written_events
    assert fast.num_received + bus.sink_stats("fast").num_dropped_events == 2000
    dropped = metrics.registry.get_sample_value(
        "kvstore_sink_dropped_events_total", {"sink": "slow", "reason": "queue_full"}
    )
    assert dropped == stats.num_dropped_events


async def test_close_meets_its_deadline_and_closes_sinks_in_order() -> None:
    closed: list[str] = []
    stuck = SlowSink("stuck", delay_s=3600, closed=closed)
    other = SlowSink("other", delay_s=0, closed=closed)
    bus = EventBus([stuck, other], max_queued_batches=100)
    await bus.start()
    for i in range(10):
        bus.publish([stored(i)])
    await asyncio.sleep(0.01)
    started = time.perf_counter()
    errors = await bus.close(deadline_s=0.3)
    assert time.perf_counter() - started < 1.5
    assert closed == ["stuck", "other"]
    assert [type(e) for e in errors] == [TimeoutError]
    assert "stuck" in str(errors[0])
    stats = bus.sink_stats("stuck")
    assert stats.num_written_events == 0
    assert stats.num_dropped_events == 10  # the one in flight plus the nine queued
    assert len(other.written) == 10
    assert await bus.close() == []  # idempotent


async def test_a_failing_write_is_counted_and_later_batches_still_flow() -> None:
    metrics = KVStoreMetrics(CollectorRegistry())
    flaky = FlakySink("flaky", 0)
    bus = EventBus([flaky], metrics=metrics, max_events_per_write=1)
    await bus.start()
    for i in range(3):
        bus.publish([stored(i)])
    await bus.close()
    assert [e.ts_s for e in flaky.written] == [0.0, 2.0]
    assert bus.sink_stats("flaky").num_errors == 1
    assert metrics.registry.get_sample_value("kvstore_sink_errors_total", {"sink": "flaky"}) == 1


async def test_publish_is_loop_thread_only_and_publish_threadsafe_works() -> None:
    sink = MemorySink()
    bus = EventBus([sink])
    await bus.start()
    errors: list[BaseException] = []

    def other_thread() -> None:
        try:
            bus.publish([stored(0)])
        except RuntimeError as exc:
            errors.append(exc)
        for i in range(5):
            bus.publish_threadsafe([stored(i)])

    thread = threading.Thread(target=other_thread)
    thread.start()
    await asyncio.to_thread(thread.join)
    await asyncio.to_thread(sink.wait_for, 5, 5.0)
    await bus.close()
    assert len(errors) == 1 and "publish_threadsafe" in str(errors[0])
    assert [e.ts_s for e in sink.take()] == [0.0, 1.0, 2.0, 3.0, 4.0]


async def test_publish_after_close_is_dropped_and_counted() -> None:
    metrics = KVStoreMetrics(CollectorRegistry())
    sink = MemorySink()
    bus = EventBus([sink], metrics=metrics)
    await bus.start()
    await bus.close()
    bus.publish([stored(1)])
    assert sink.take() == []
    assert bus.sink_stats("memory").num_dropped_events == 1
    labels = {"sink": "memory", "reason": "closed"}
    assert metrics.registry.get_sample_value("kvstore_sink_dropped_events_total", labels) == 1


async def test_a_sink_that_fails_to_start_closes_the_ones_started() -> None:
    closed: list[str] = []

    class Broken(SlowSink):
        async def start(self) -> None:
            raise OSError("address in use")

    first = SlowSink("first", 0, closed)
    bus = EventBus([first, Broken("broken", 0, closed)])
    with pytest.raises(OSError, match="address in use"):
        await bus.start()
    assert closed == ["first"]


def test_sink_names_must_be_unique() -> None:
    with pytest.raises(ConfigError, match="unique"):
        EventBus([MemorySink("x"), MemorySink("x")])


def test_memory_sink_is_bounded() -> None:
    sink = MemorySink(max_events=3)
    sink.extend([stored(i) for i in range(5)])
    assert [e.ts_s for e in sink.take()] == [2.0, 3.0, 4.0]
    assert sink.num_discarded == 2
    assert sink.num_received == 5
