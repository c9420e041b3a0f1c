"""`DiskPipeline` (the disk-only configuration LMDBTier drives), one rule at a time, with no
threads: stores from the caller's rows, loads into them, roll-back of refused work, discard
reasons, touches, protected lookup hits, and the drain. Milliseconds each; tests/lmdb_tier/
proves the wiring to vLLM and a real LMDB store."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pytest

from kvstore.events import ChunkRemoved, ChunkStored
from kvstore.index.disk import DiskIndex
from kvstore.index.event_log import EventLog
from kvstore.keys import BlockKey, Tier
from kvstore.pipeline import DiskPipeline
from kvstore.service.completions import Completion, PromotionDone, WriteDone
from kvstore.service.disk_io import DiskIO
from kvstore.service.inline import InlineTierService
from tiers.memory import MemoryStore

from .doubles import Observer

CHUNK_BYTES = 64
TOKENS = 16
NS = "disk0000"


def k(i: int) -> BlockKey:
    return BlockKey(i.to_bytes(8, "big"))


class Rows:
    """The caller's rows (vLLM's primary slots)."""

    def __init__(self, num_rows: int) -> None:
        self.data = bytearray(num_rows * CHUNK_BYTES)

    def row(self, index: int) -> memoryview:
        return memoryview(self.data)[index * CHUNK_BYTES : (index + 1) * CHUNK_BYTES]


class Service(InlineTierService):
    """The inline service with what the disk-only pipeline's drain also asks for."""

    is_disk_up = True

    def submit_call(self, fn: Callable[[], object]) -> None:
        self.run_pending()
        fn()

    def drain_completions(self, timeout_s: float = 0.0) -> list[Completion]:
        if timeout_s > 0:
            self.run_pending()  # "waits": the work runs now
        return super().drain_completions()


@dataclass
class Rig:
    pipeline: DiskPipeline
    service: Service
    store: MemoryStore
    rows: Rows
    observer: Observer

    def store_rows(self, *ids: int) -> list[Completion]:
        for slot, i in enumerate(ids):
            self.rows.row(slot)[:] = bytes([i]) * CHUNK_BYTES
        self.pipeline.prepare_store([(k(i), slot) for slot, i in enumerate(ids)])
        self.service.run_pending()
        return list(self.pipeline.poll())

    def removed(self, reason: str) -> list[BlockKey]:
        return [
            key
            for e in self.observer.events
            if isinstance(e, ChunkRemoved) and e.reason == reason
            for key in e.keys
        ]


def make_rig(num_chunks: int = 4, *, has_disk: bool = True) -> Rig:
    store = MemoryStore(capacity_bytes=16 * CHUNK_BYTES)
    store.register_namespace(NS, {"test": "disk pipeline"})
    rows = Rows(8)
    service = Service(DiskIO(store, NS, rows) if has_disk else None)
    log = EventLog(TOKENS)
    observer = Observer()
    index = DiskIndex("lru", num_chunks * CHUNK_BYTES, CHUNK_BYTES, log)
    pipeline = DiskPipeline(index, log, service, [observer], num_tokens_per_chunk=TOKENS)
    return Rig(pipeline, service, store, rows, observer)


@pytest.fixture
def rig() -> Rig:
    return make_rig()


def test_a_store_is_written_then_ready_and_reported_once(rig: Rig) -> None:
    assert not rig.pipeline.lookup(k(1))
    plan = rig.pipeline.prepare_store([(k(1), 0), (k(2), 1)])
    assert plan.keys == (k(1), k(2)) and rig.pipeline.is_busy
    assert not rig.pipeline.lookup(k(1))  # being written: its bytes are in the caller's row
    rig.service.run_pending()
    (done,) = rig.pipeline.poll()
    assert isinstance(done, WriteDone) and done.ok == (k(1), k(2))
    assert rig.pipeline.lookup(k(1)) and not rig.pipeline.is_busy
    stored = [e for e in rig.observer.events if isinstance(e, ChunkStored)]
    assert [key for e in stored for key in e.keys] == [k(1), k(2)]
    assert rig.pipeline.take_events() == rig.observer.events == rig.service.published
    assert rig.observer.lookups[-1] == (1, TOKENS, {Tier.DISK: (1, TOKENS)})


def test_a_refused_write_is_rolled_back() -> None:
    rig = make_rig(has_disk=False)  # the service refuses every write
    plan = rig.pipeline.prepare_store([(k(1), 0)])
    assert plan.is_refused and plan.keys == ()
    assert rig.pipeline.index.occupancy().used_bytes == 0 and not rig.pipeline.is_busy


def test_a_lookup_hit_is_protected_until_the_step_ends(rig: Rig) -> None:
    rig.store_rows(1, 2, 3, 4)  # full
    assert all(rig.pipeline.lookup(k(i)) for i in (1, 2, 3, 4))
    plan = rig.pipeline.prepare_store([(k(5), 0)])
    assert plan.keys == () and plan.skipped == (k(5),)  # every chunk is promised to a load
    rig.pipeline.end_step()
    rig.pipeline.touch([k(2), k(3), k(4)])  # k(1) is now the least recently used
    assert rig.pipeline.prepare_store([(k(5), 0)]).keys == (k(5),)
    assert rig.removed("evicted") == [k(1)]


def test_a_load_reads_into_the_given_rows_and_touches_what_it_served(rig: Rig) -> None:
    rig.store_rows(1, 2)
    plan = rig.pipeline.prepare_load([(k(2), 6), (k(9), 7)], tag="job")
    assert plan.keys == (k(2),) and plan.missing == (k(9),)
    assert rig.observer.load_failures == [1] and rig.service.touched == []
    rig.service.run_pending()
    (done,) = rig.pipeline.poll()
    assert isinstance(done, PromotionDone) and done.tag == "job" and done.ok == (k(2),)
    assert bytes(rig.rows.row(6)) == bytes([2]) * CHUNK_BYTES
    assert rig.service.touched == [k(2)]  # served: a hit on the disk record
    assert rig.pipeline.index.table.num_pinned == 0


@pytest.mark.parametrize(("damage", "reason"), [("corrupt", "corrupt"), ("delete", "deleted")])
def test_a_damaged_or_vanished_chunk_fails_its_load_and_leaves(
    rig: Rig, damage: str, reason: str
) -> None:
    rig.store_rows(1)
    if damage == "corrupt":
        rig.store.corrupt(NS, k(1))
    else:
        rig.store.delete_many(NS, [k(1)])
    rig.pipeline.prepare_load([(k(1), 6)], tag=1)
    rig.service.run_pending()
    rig.pipeline.poll()
    assert rig.removed(reason) == [k(1)] and not rig.pipeline.lookup(k(1))
    assert rig.observer.load_failures == [1] and rig.service.touched == []
    assert rig.pipeline.index.occupancy().used_bytes == 0


def test_a_failed_read_keeps_the_chunk(rig: Rig) -> None:
    rig.store_rows(1)
    rig.service.num_fail_promotions = 1
    rig.pipeline.prepare_load([(k(1), 6)], tag=1)
    rig.service.run_pending()
    rig.pipeline.poll()
    assert rig.observer.load_failures == [1] and rig.pipeline.lookup(k(1))  # maybe transient
    assert rig.pipeline.index.table.num_pinned == 0


def test_drain_applies_everything_and_poll_hands_it_out_after(rig: Rig) -> None:
    rig.pipeline.prepare_store([(k(1), 0)])
    rig.pipeline.prepare_load([], tag=2)
    assert rig.pipeline.is_busy
    assert rig.pipeline.drain(timeout_s=1.0)
    assert not rig.pipeline.is_busy and rig.pipeline.lookup(k(1))
    assert [type(done) for done in rig.pipeline.poll()] == [WriteDone]
    assert rig.pipeline.poll() == []
