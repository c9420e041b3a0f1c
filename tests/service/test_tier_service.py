"""TierService without vLLM: write-through, promotion, and what happens when its tasks die.

A task that dies must not silently stop the disk tier: its batch and queue are failed back to
the owner (so pinned rows are released), it is restarted, and after repeated deaths the disk
tier is marked down (metric) and write-throughs are dropped and counted. Shutdown is bounded
even when a reader hangs.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from kvstore.keys import BlockKey, Tier
from kvstore.metrics import KVStoreMetrics
from kvstore.service import PromotionDone, TierService, WriteDone
from kvstore.service.disk_io import DiskIO
from tiers.memory import MemoryStore

NS = "ns"
ROW_BYTES = 64


class Rows:
    def __init__(self, num_rows: int = 16) -> None:
        self.data = [bytearray(bytes([i]) * ROW_BYTES) for i in range(num_rows)]

    def row(self, index: int) -> memoryview:
        return memoryview(self.data[index])


def key(i: int) -> BlockKey:
    return BlockKey(i.to_bytes(32, "big"))


def make(store: Any = None, *, timeout_s: float = 5.0) -> tuple[TierService, Any, KVStoreMetrics]:
    store = store or MemoryStore(1 << 20)
    store.register_namespace(NS, {"row_bytes": ROW_BYTES})
    metrics = KVStoreMetrics(CollectorRegistry())
    service = TierService(
        disk=DiskIO(store, NS, Rows()), metrics=metrics, shutdown_timeout_s=timeout_s
    )
    service.start()
    return service, store, metrics


def wait_for(predicate: Callable[[], object], timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.005)


def completions_until(service: TierService, count: int) -> list[Any]:
    got: list[Any] = []
    wait_for(lambda: got.extend(service.drain_completions()) or len(got) >= count)
    return got


def test_write_through_lands_and_promotion_reads_back() -> None:
    service, store, _ = make()
    try:
        assert service.submit_write([(key(1), 3), (key(2), 4)], [])
        (done,) = completions_until(service, 1)
        assert isinstance(done, WriteDone) and done.ok == (key(1), key(2))
        assert done.num_bytes == 2 * ROW_BYTES
        assert service.submit_promotion([(key(1), 9)])
        (promoted,) = completions_until(service, 1)
        assert isinstance(promoted, PromotionDone) and promoted.ok == (key(1),)
        assert store.contains(NS, key(2))
    finally:
        service.close()


def test_a_dying_write_task_fails_its_batch_then_restarts() -> None:
    service, _, _ = make()
    real = service._record
    calls = {"n": 0}

    def flaky(report: Any, op: Any) -> None:  # a bug after the write: the task dies
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("bug in metrics")
        real(report, op)

    service._record = flaky  # type: ignore[method-assign]
    try:
        assert service.submit_write([(key(1), 1)], [])
        (first,) = completions_until(service, 1)
        assert first.ok == (key(1),)  # the batch's result was delivered before the task died
        assert service.submit_write([(key(2), 2)], [])  # the restarted loop keeps writing
        (second,) = completions_until(service, 1)
        assert second.ok == (key(2),)
        assert service.is_disk_up
    finally:
        service.close()


class BrokenStore(MemoryStore):
    """A store whose puts hit a bug (not an I/O error): the write task dies every time."""

    def put_many(self, ns: str, items: Sequence[Any], *, now_s: float | None = None) -> int:
        raise TypeError("a bug, not an I/O error")


def test_repeated_deaths_mark_the_disk_down_and_fail_every_write() -> None:
    service, _, metrics = make(BrokenStore(1 << 20))
    try:
        for i in range(4):
            assert service.submit_write([(key(i), i)], [])
            (done,) = completions_until(service, 1)
            assert (done.ok, done.failed) == ((), (key(i),))  # rows can be unpinned
        wait_for(lambda: not service.is_disk_up)
        assert not service.submit_write([(key(9), 9)], [])  # dropped, counted
        registry = metrics.registry
        assert registry.get_sample_value("kvstore_tier_up", {"tier": Tier.DISK.value}) == 0
        dropped = registry.get_sample_value(
            "kvstore_queue_dropped_total", {"queue": "write_through", "reason": "tier_down"}
        )
        assert dropped is not None and dropped >= 2
    finally:
        service.close()


class HangingStore(MemoryStore):
    def __init__(self, capacity_bytes: int) -> None:
        super().__init__(capacity_bytes)
        self.release = threading.Event()
        self.closed = False

    def get_many_into(self, ns: str, items: Sequence[Any]) -> list[Any]:
        self.release.wait(30)
        return super().get_many_into(ns, items)

    def close(self) -> None:
        self.closed = True
        super().close()


def test_shutdown_is_bounded_by_a_hung_reader_and_leaves_the_store_open() -> None:
    store = HangingStore(1 << 20)
    service, _, _ = make(store, timeout_s=0.5)
    try:
        assert service.submit_write([(key(1), 1)], [])
        completions_until(service, 1)
        assert service.submit_promotion([(key(1), 2)])
        time.sleep(0.1)  # the reader is now stuck in get_many_into
        start = time.monotonic()
        service.close()
        assert time.monotonic() - start < 3.0
        assert not store.closed  # a thread still uses it: closing it could crash
    finally:
        store.release.set()


def test_close_drains_queued_writes_first() -> None:
    class SlowStore(MemoryStore):
        def put_many(self, ns: str, items: Sequence[Any], *, now_s: float | None = None) -> int:
            time.sleep(0.05)
            return super().put_many(ns, items, now_s=now_s)

    service, store, _ = make(SlowStore(1 << 20))
    for i in range(5):
        assert service.submit_write([(key(i), i)], [])
    service.close()
    assert all(store.contains(NS, key(i)) for i in range(5))


class SlowDeletes(MemoryStore):
    def delete_many(self, namespace: str, keys: Sequence[bytes]) -> int:
        time.sleep(0.2)
        return super().delete_many(namespace, keys)


def test_a_corrupt_chunk_found_just_before_close_is_deleted_by_close() -> None:
    """The delete of a chunk a read found corrupt is queued work like a write: shutdown drains
    it (a detected-corrupt value left on disk was a reliability-suite finding)."""
    service, store, _ = make(SlowDeletes(1 << 20))
    assert service.submit_write([(key(1), 1), (key(2), 2)], [])
    completions_until(service, 1)
    store.corrupt(NS, key(1))
    service.submit_call(lambda: time.sleep(0.3))  # the writer is busy: the delete waits in line
    assert service.submit_promotion([(key(1), 5), (key(2), 6)])
    (promoted,) = completions_until(service, 1)
    assert promoted.corrupt == (key(1),) and promoted.ok == (key(2),)
    assert service.close()
    assert not store.contains(NS, key(1)) and store.contains(NS, key(2))


def test_wait_idle_waits_for_deletes_and_calls() -> None:
    service, store, _ = make(SlowDeletes(1 << 20))
    try:
        assert service.submit_write([(key(1), 1)], [])
        assert service.wait_idle(5.0)
        ran = threading.Event()
        service.submit_delete([key(1)])
        service.submit_call(ran.set)
        assert not service.wait_idle(0.05)  # the delete takes 0.2 s, the call runs after it
        assert service.wait_idle(5.0)
        assert ran.is_set() and not store.contains(NS, key(1))
    finally:
        service.close()


@pytest.mark.parametrize("num_chunks", [300])
def test_a_full_queue_drops_and_counts(num_chunks: int) -> None:
    service, _, metrics = make()
    try:
        items = [(key(i), i % 16) for i in range(num_chunks)]  # more than the 256-chunk bound
        assert not service.submit_write(items, [])
        dropped = metrics.registry.get_sample_value(
            "kvstore_queue_dropped_total", {"queue": "write_through", "reason": "queue_full"}
        )
        assert dropped == num_chunks
    finally:
        service.close()


def test_held_writes_wait_for_the_namespace_and_run_after_its_registration() -> None:
    """An engine's disk namespace is registered only once its worker reported the chunk
    layout; a write queued before that (a remote hit landing in the first step) waits for
    the registration instead of failing with "not registered"."""
    store = MemoryStore(1 << 20)  # NS not registered yet
    service = TierService(disk=DiskIO(store, NS, Rows()), hold_writes=True)
    service.start()
    try:
        assert service.submit_write([(key(1), 1), (key(2), 2)], [])
        service.submit_delete([key(9)])
        assert not service.wait_idle(0.2)  # held: nothing ran
        assert service.drain_completions() == [] and NS not in store.namespaces()
        service.release_writes(first=lambda: store.register_namespace(NS, {"row_bytes": 64}))
        (done,) = completions_until(service, 1)
        assert isinstance(done, WriteDone) and done.ok == (key(1), key(2))
        assert store.contains(NS, key(1)) and service.wait_idle(5.0)
    finally:
        service.close()


def test_writes_still_held_at_close_are_failed_and_counted_not_written() -> None:
    store = MemoryStore(1 << 20)
    metrics = KVStoreMetrics(CollectorRegistry())
    service = TierService(disk=DiskIO(store, NS, Rows()), metrics=metrics, hold_writes=True)
    service.start()
    assert service.submit_write([(key(1), 1)], [])
    start = time.monotonic()
    assert service.close()
    assert time.monotonic() - start < 2.0  # not the drain's deadline
    (done,) = service.drain_completions()
    assert isinstance(done, WriteDone) and done.failed == (key(1),)
    dropped = metrics.registry.get_sample_value(
        "kvstore_queue_dropped_total", {"queue": "write_through", "reason": "closed"}
    )
    assert dropped == 1 and store.namespaces() == {}


def test_a_remote_slower_than_the_local_start_still_starts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A Redis that accepts and never answers (or answers across a slow link): the remote
    tier's start takes its own timeouts (a connect, a subscribe), which may exceed the local
    tiers' start bound; the service starts anyway and serves from the local tiers."""
    from kvstore.remote import RemoteChunks, RemoteStore
    from kvstore.service.disk_io import RowBuffers
    from tests.remote.conftest import descriptor, make_config

    monkeypatch.setattr("kvstore.service.tier_service._START_TIMEOUT_S", 0.5)
    silent = socket.create_server(("127.0.0.1", 0))  # accepts; never reads nor answers
    port = silent.getsockname()[1]
    rows: RowBuffers = Rows()  # type: ignore[assignment]
    store = RemoteStore(make_config(f"redis://127.0.0.1:{port}/0", remote_timeout_ms=600))
    service = TierService(disk=None, remote=RemoteChunks(store, descriptor()), remote_rows=rows)
    try:
        start_s = time.monotonic()
        service.start()  # raised TimeoutError past the local bound before
        assert 0.5 < time.monotonic() - start_s < 0.5 + 2 * 0.6 + 0.5
        assert service.remote is not None
    finally:
        service.close()
        silent.close()
