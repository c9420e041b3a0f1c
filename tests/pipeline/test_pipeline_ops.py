"""TierPipeline's operations, one behaviour at a time, with no threads (InlineTierService over a
MemoryStore): prepare/complete of stores, write-through, lookups, promotions, loads, and every
failure path. Each test runs in milliseconds; the real-engine tests prove the wiring."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from kvstore.events import ChunkRemoved, ChunkStored, TierEvent
from kvstore.index import IndexConfig, TierIndex
from kvstore.keys import BlockKey, Tier
from kvstore.pipeline import TierPipeline
from kvstore.pipeline.load_cost import LoadCostModel
from kvstore.service.disk_io import DiskIO
from kvstore.service.inline import InlineTierService
from tiers.memory import MemoryStore

from .doubles import Observer

CHUNK_BYTES = 64
TOKENS = 16
NS = "pipe0000"


def k(i: int) -> BlockKey:
    return BlockKey(i.to_bytes(8, "big"))


def ks(*ids: int) -> list[BlockKey]:
    return [k(i) for i in ids]


class Rows:
    def __init__(self, num_rows: int) -> None:
        self.data = bytearray(num_rows * CHUNK_BYTES)

    def row(self, index: int) -> memoryview:
        return memoryview(self.data)[index * CHUNK_BYTES : (index + 1) * CHUNK_BYTES]


@dataclass
class Rig:
    pipeline: TierPipeline
    service: InlineTierService
    store: MemoryStore
    rows: Rows
    observer: Observer

    @property
    def index(self) -> TierIndex:
        return self.pipeline.index

    def store_chunks(self, keys: list[BlockKey], *, ok: bool = True) -> tuple[int, ...]:
        plan = self.pipeline.prepare_store(keys)
        assert plan is not None
        for key, row in zip(plan.keys, plan.rows, strict=True):
            self.rows.row(row)[:] = key * (CHUNK_BYTES // len(key))
        self.pipeline.complete_store(plan.keys, ok=ok)
        return plan.rows

    def settle(self) -> None:
        while self.service.run_pending():
            self.pipeline.poll()
        self.pipeline.poll()

    def events(self, kind: type[TierEvent], tier: Tier) -> list[BlockKey]:
        found = [e for e in self.observer.events if isinstance(e, kind) and e.tier is tier]
        return [key for e in found for key in e.keys]  # type: ignore[attr-defined]


@pytest.fixture
def rig() -> Rig:
    return make_rig()


def make_rig(
    num_cpu_rows: int = 4, num_disk_chunks: int = 8, *, cost: LoadCostModel | None = None
) -> Rig:
    config = IndexConfig(num_cpu_rows, CHUNK_BYTES, TOKENS, num_disk_chunks * CHUNK_BYTES)
    store = MemoryStore(capacity_bytes=num_disk_chunks * CHUNK_BYTES)
    store.register_namespace(NS, {"test": "pipeline"})
    rows = Rows(num_cpu_rows)
    service = InlineTierService(DiskIO(store, NS, rows))
    observer = Observer()
    pipeline = TierPipeline(
        TierIndex(config), service, [observer], num_tokens_per_chunk=TOKENS, cost=cost
    )
    return Rig(pipeline, service, store, rows, observer)


def evict_from_cpu(rig: Rig, keys: list[BlockKey], filler_start: int = 100) -> None:
    """Store other chunks until `keys` have left the CPU tier (they stay on disk)."""
    filler = filler_start
    while any(rig.index.state_of(Tier.CPU, key) is not None for key in keys):
        rig.store_chunks(ks(filler))
        rig.settle()
        filler += 1


# -- stores and write-through ---------------------------------------------------------------


def test_a_completed_store_is_written_through_and_reported_per_tier(rig: Rig) -> None:
    rig.store_chunks(ks(1, 2))
    assert rig.events(ChunkStored, Tier.CPU) == ks(1, 2)
    assert rig.service.num_pending == 1 and rig.index.stats().cpu.num_pinned == 2
    rig.settle()
    assert rig.events(ChunkStored, Tier.DISK) == ks(1, 2)
    assert rig.store.contains(NS, k(1)) and rig.index.stats().cpu.num_pinned == 0
    assert rig.pipeline.take_events() == rig.observer.events  # once, to every observer
    assert rig.service.published == rig.observer.events
    rig.index.check_invariants()


def test_a_failed_store_frees_its_rows_and_writes_nothing(rig: Rig) -> None:
    rig.store_chunks(ks(1), ok=False)
    rig.settle()
    assert rig.index.state_of(Tier.CPU, k(1)) is None
    assert rig.service.num_pending == 0 and not rig.store.contains(NS, k(1))
    assert rig.observer.events == []


def test_a_failed_write_through_drops_the_disk_entry_and_unpins(rig: Rig) -> None:
    rig.service.num_fail_writes = 1
    rig.store_chunks(ks(1))
    rig.settle()
    assert rig.index.state_of(Tier.DISK, k(1)) is None
    assert rig.index.state_of(Tier.CPU, k(1)) is not None  # still served from CPU
    assert rig.index.stats().cpu.num_pinned == 0
    assert rig.events(ChunkStored, Tier.DISK) == []
    rig.index.check_invariants()


# -- lookups and loads ------------------------------------------------------------------------


def test_a_cpu_hit_holds_then_loads_then_unpins(rig: Rig) -> None:
    rig.store_chunks(ks(1, 2))
    rig.settle()
    answer = rig.pipeline.prepare_lookup("r1", ks(1, 2, 3))
    assert answer.tiers == (Tier.CPU, Tier.CPU) and not answer.is_pending
    assert rig.observer.lookups == [(3, 3 * TOKENS, _hits(cpu=(2, 2 * TOKENS)))]
    plan = rig.pipeline.prepare_load("r1", ks(1, 2))
    assert plan.keys == tuple(ks(1, 2)) and rig.service.touched == []
    rig.pipeline.complete_load(plan.keys, ok=True)
    assert rig.service.touched == ks(1, 2)  # served: a hit on the disk records
    assert rig.index.stats().cpu.num_pinned == 0 and rig.index.stats().num_holds == 0
    rig.index.check_invariants()


def test_a_lookup_is_counted_once_per_requester_minus_its_own_tokens(rig: Rig) -> None:
    rig.store_chunks(ks(1))
    rig.settle()
    rig.pipeline.prepare_lookup("r1", ks(1, 2), skip_tokens=4)
    rig.pipeline.prepare_lookup("r1", ks(1, 2), skip_tokens=4)  # asked again: not recounted
    assert rig.observer.lookups == [(2, 2 * TOKENS - 4, _hits(cpu=(1, TOKENS - 4)))]


def test_a_failed_load_is_reported_so_the_engine_recomputes(rig: Rig) -> None:
    rig.store_chunks(ks(1))
    rig.settle()
    rig.pipeline.prepare_lookup("r1", ks(1))
    plan = rig.pipeline.prepare_load("r1", ks(1))
    rig.pipeline.complete_load(plan.keys, ok=False)
    assert rig.observer.load_failures == [1]
    assert rig.service.touched == []  # not served: no hit
    assert rig.index.stats().cpu.num_pinned == 0


def test_a_chunk_gone_before_its_load_is_missing(rig: Rig) -> None:
    rig.store_chunks(ks(1))
    plan = rig.pipeline.prepare_load("r1", ks(1, 2))
    assert plan.keys == (k(1),) and plan.missing == (k(2),)
    assert rig.observer.load_failures == [1]  # recomputed
    rig.pipeline.complete_load(plan.keys, ok=True)


def test_release_drops_the_holds_of_an_abandoned_lookup() -> None:
    rig = make_rig(num_cpu_rows=2)
    rig.store_chunks(ks(2))
    rig.settle()
    evict_from_cpu(rig, ks(2))
    rig.store_chunks(ks(1))
    rig.settle()
    assert rig.pipeline.prepare_lookup("r1", ks(1, 2)).is_pending  # 1 in CPU, 2 promoting
    assert rig.index.stats().num_holds == 2
    rig.pipeline.release("r1")  # abandoned: its CPU hit is let go, the promotion runs on
    assert rig.index.stats().num_holds == 1
    rig.pipeline.forget("r1")
    rig.settle()
    assert rig.index.stats().num_holds == 0 and rig.index.stats().cpu.num_pinned == 0
    rig.index.check_invariants()


# -- promotions from disk -----------------------------------------------------------------------


def test_a_disk_hit_is_pending_until_promoted_then_loads_the_stored_bytes() -> None:
    rig = make_rig(num_cpu_rows=2)
    rig.store_chunks(ks(1, 2))
    rig.settle()
    evict_from_cpu(rig, ks(1, 2))
    assert rig.pipeline.prepare_lookup("r1", ks(1, 2)).is_pending
    assert rig.pipeline.prepare_lookup("r1", ks(1, 2)).is_pending  # nothing ran yet
    rig.settle()
    answer = rig.pipeline.prepare_lookup("r1", ks(1, 2))
    assert answer.tiers == (Tier.DISK, Tier.DISK)
    plan = rig.pipeline.prepare_load("r1", ks(1, 2))
    for key, row in zip(plan.keys, plan.rows, strict=True):
        assert bytes(rig.rows.row(row)) == key * (CHUNK_BYTES // len(key))
    rig.pipeline.complete_load(plan.keys, ok=True)
    rig.pipeline.forget("r1")
    assert rig.observer.lookups[-1][2][Tier.DISK] == (2, 2 * TOKENS)
    rig.index.check_invariants()


def test_a_failed_promotion_answers_the_cpu_prefix_only() -> None:
    rig = make_rig(num_cpu_rows=2)
    rig.store_chunks(ks(1))
    rig.settle()
    evict_from_cpu(rig, ks(1))
    rig.service.num_fail_promotions = 1
    assert rig.pipeline.prepare_lookup("r1", ks(1)).is_pending
    rig.settle()
    assert rig.pipeline.prepare_lookup("r1", ks(1)).num_hits == 0
    assert rig.index.state_of(Tier.DISK, k(1)) is not None  # a read failure: still on disk
    rig.pipeline.forget("r1")
    rig.index.check_invariants()


@pytest.mark.parametrize(("damage", "reason"), [("corrupt", "corrupt"), ("missing", "deleted")])
def test_a_corrupt_or_vanished_disk_chunk_is_discarded_with_its_reason(
    damage: str, reason: str
) -> None:
    rig = make_rig(num_cpu_rows=2)
    rig.store_chunks(ks(1))
    rig.settle()
    evict_from_cpu(rig, ks(1))
    if damage == "corrupt":
        rig.store.corrupt(NS, k(1))
    else:
        rig.store.delete_many(NS, [k(1)])
    rig.pipeline.prepare_lookup("r1", ks(1))
    rig.settle()
    assert rig.pipeline.prepare_lookup("r1", ks(1)).num_hits == 0
    assert rig.index.state_of(Tier.DISK, k(1)) is None
    removed = [e for e in rig.observer.events if isinstance(e, ChunkRemoved)]
    assert any(e.tier is Tier.DISK and k(1) in e.keys and e.reason == reason for e in removed)
    rig.index.check_invariants()


def test_a_requester_gone_mid_promotion_leaves_nothing_held() -> None:
    rig = make_rig(num_cpu_rows=2)
    rig.store_chunks(ks(1))
    rig.settle()
    evict_from_cpu(rig, ks(1))
    assert rig.pipeline.prepare_lookup("r1", ks(1)).is_pending
    rig.pipeline.forget("r1")
    rig.settle()
    stats = rig.index.stats()
    assert stats.num_holds == 0 and stats.num_promoting == 0 and stats.cpu.num_pinned == 0
    assert rig.pipeline.prepare_lookup("r2", ks(1)).tiers == (Tier.CPU,)  # landed, servable
    rig.index.check_invariants()


def test_a_second_requester_waits_for_a_promotion_in_flight() -> None:
    rig = make_rig(num_cpu_rows=2)
    rig.store_chunks(ks(1))
    rig.settle()
    evict_from_cpu(rig, ks(1))
    assert rig.pipeline.prepare_lookup("r1", ks(1)).is_pending
    assert rig.pipeline.prepare_lookup("r2", ks(1)).is_pending
    rig.settle()
    assert rig.pipeline.prepare_lookup("r2", ks(1)).num_hits == 1
    assert rig.pipeline.prepare_lookup("r1", ks(1)).num_hits == 1


def _hits(**by_tier: tuple[int, int]) -> dict[Tier, tuple[int, int]]:
    hits = {tier: (0, 0) for tier in Tier}
    hits.update({Tier(name): value for name, value in by_tier.items()})
    return hits
