"""TierPipeline's remote-tier path (probe, fetch into CPU rows, write-through, removals) with no
threads: two engines, each an InlineTierService over a MemoryStore, sharing one in-memory remote
tier (Redis with allkeys-lru). Each test runs in milliseconds."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from kvstore.events import ChunkRemoved, ChunkStored, TierEvent
from kvstore.index import IndexConfig, TierIndex
from kvstore.keys import BlockKey, Tier
from kvstore.pipeline import TierPipeline
from kvstore.pipeline.load_cost import LoadCostModel
from kvstore.service.completions import Completion
from kvstore.service.disk_io import DiskIO
from kvstore.service.inline import InlineTierService
from kvstore.service.inline_remote import SharedRemote
from tiers.memory import MemoryStore

from .test_pipeline_ops import CHUNK_BYTES, NS, TOKENS, Observer, Rows, k, ks


@dataclass
class Engine:
    pipeline: TierPipeline
    service: InlineTierService
    rows: Rows
    observer: Observer

    @property
    def index(self) -> TierIndex:
        return self.pipeline.index

    def store_chunks(self, keys: list[BlockKey]) -> None:
        plan = self.pipeline.prepare_store(keys)
        assert plan is not None
        for key, row in plan.items():
            self.rows.row(row)[:] = key * (CHUNK_BYTES // len(key))
        self.pipeline.complete_store(plan.keys, ok=True)

    def settle(self) -> None:
        while self.service.run_pending():
            self.pipeline.poll()

    def lookup(self, owner: str, keys: list[BlockKey]) -> tuple[Tier, ...]:
        """Ask until the answer is final (running the I/O in between); the answer's tiers."""
        for _ in range(10):
            answer = self.pipeline.prepare_lookup(owner, keys)
            if not answer.is_pending:
                return answer.tiers
            assert self.service.run_pending(), "pending with nothing queued"
        raise AssertionError("still pending after 10 rounds")

    def events(self, kind: type[TierEvent], tier: Tier) -> list[BlockKey]:
        found = [e for e in self.observer.events if isinstance(e, kind) and e.tier is tier]
        return [key for e in found for key in e.keys]


def make_engine(
    remote: SharedRemote,
    *,
    num_cpu_rows: int = 8,
    has_disk: bool = True,
    cost: LoadCostModel | None = None,
    promotion_wait_s: float = 0.0,
) -> Engine:
    disk_bytes = 16 * CHUNK_BYTES if has_disk else 0
    config = IndexConfig(num_cpu_rows, CHUNK_BYTES, TOKENS, disk_bytes)
    rows = Rows(num_cpu_rows)
    disk = None
    if has_disk:
        store = MemoryStore(capacity_bytes=disk_bytes)
        store.register_namespace(NS, {"test": "pipeline-remote"})
        disk = DiskIO(store, NS, rows)
    service = InlineTierService(disk, remote=remote, remote_rows=rows)
    observer = Observer()
    pipeline = TierPipeline(
        TierIndex(config), service, [observer], num_tokens_per_chunk=TOKENS, cost=cost,
        promotion_wait_s=promotion_wait_s,
    )  # fmt: skip
    return Engine(pipeline, service, rows, observer)


def test_what_one_engine_stores_another_fetches_and_keeps_on_its_disk() -> None:
    shared = SharedRemote(16)
    first, second = make_engine(shared), make_engine(shared)
    first.store_chunks(ks(1, 2, 3))
    first.settle()
    assert first.events(ChunkStored, Tier.REMOTE) == ks(1, 2, 3)
    assert first.index.stats().cpu.num_pinned == 0  # the write's pins are gone

    assert second.lookup("r1", ks(1, 2, 3, 4)) == (Tier.REMOTE,) * 3
    plan = second.pipeline.prepare_load("r1", ks(1, 2, 3))
    for key, row in plan.items():
        assert bytes(second.rows.row(row)) == key * (CHUNK_BYTES // len(key))
    second.pipeline.complete_load(plan.keys, ok=True)
    second.pipeline.forget("r1")
    second.settle()
    assert second.observer.lookups[-1][2][Tier.REMOTE] == (3, 3 * TOKENS)
    assert second.events(ChunkStored, Tier.DISK) == ks(1, 2, 3)  # written through
    assert second.events(ChunkStored, Tier.REMOTE) == []  # fetched, not written back
    stats = second.index.stats()
    assert stats.num_holds == 0 and stats.cpu.num_pinned == 0
    second.index.check_invariants()


def test_a_remote_hit_goes_to_the_local_disk_after_its_load_not_beside_it() -> None:
    """The disk copy of a remote hit is written once the requester's load has landed: a disk
    write of the whole prompt beside its load and forward slowed the first token (in-process,
    2-vCPU VM, 2048 tokens: 308 ms median, 261 ms with the write after the load). Held for the
    load, the chunks are not written yet."""
    shared = SharedRemote(16)
    writer, reader = make_engine(shared), make_engine(shared)
    writer.store_chunks(ks(1, 2, 3))
    writer.settle()

    assert reader.lookup("r1", ks(1, 2, 3)) == (Tier.REMOTE,) * 3
    reader.settle()
    assert reader.events(ChunkStored, Tier.DISK) == []  # the requester has not loaded them
    plan = reader.pipeline.prepare_load("r1", ks(1, 2, 3))
    reader.settle()
    assert reader.events(ChunkStored, Tier.DISK) == []  # its copy into the engine is under way
    reader.pipeline.complete_load(plan.keys, ok=True)
    reader.settle()
    assert reader.events(ChunkStored, Tier.DISK) == ks(1, 2, 3)
    reader.pipeline.forget("r1")
    assert reader.index.stats().num_holds == 0 and reader.index.stats().cpu.num_pinned == 0
    reader.index.check_invariants()


@pytest.mark.parametrize("ending", ["release", "forget"])
def test_a_remote_hit_its_requester_does_not_load_still_goes_to_the_local_disk(
    ending: str,
) -> None:
    """A requester that lets its remote hit go (vLLM allocated no blocks for it, or it was
    aborted) does not leave the chunks without their disk copy."""
    shared = SharedRemote(16)
    writer, reader = make_engine(shared), make_engine(shared)
    writer.store_chunks(ks(1, 2))
    writer.settle()
    assert reader.lookup("r1", ks(1, 2)) == (Tier.REMOTE,) * 2
    reader.settle()
    assert reader.events(ChunkStored, Tier.DISK) == []
    getattr(reader.pipeline, ending)("r1")
    reader.settle()
    assert reader.events(ChunkStored, Tier.DISK) == ks(1, 2)
    reader.pipeline.forget("r1")
    assert reader.index.stats().num_holds == 0 and reader.index.stats().cpu.num_pinned == 0


def test_a_fetch_skips_the_chunks_already_in_cpu() -> None:
    """The remote tier holds 1-5, this engine's CPU holds 3: one fetch of 1, 2, 4, 5 serves all
    five, and only those four are counted remote hits."""
    shared = SharedRemote(16)
    writer, reader = make_engine(shared), make_engine(shared, has_disk=False)
    writer.store_chunks(ks(1, 2, 3, 4, 5))
    writer.settle()
    reader.store_chunks(ks(3))
    reader.settle()
    remote, cpu = Tier.REMOTE, Tier.CPU
    assert reader.lookup("r1", ks(1, 2, 3, 4, 5)) == (remote, remote, cpu, remote, remote)
    assert reader.observer.lookups[-1][2][Tier.REMOTE] == (4, 4 * TOKENS)
    reader.pipeline.release("r1")
    reader.pipeline.forget("r1")
    assert reader.index.stats().num_holds == 0


def test_the_remote_prefix_continues_past_a_local_chunk_it_does_not_hold() -> None:
    """The remote tier holds 1-2 and 4-5 but not 3, which this engine has in CPU: the fetched
    run and the local chunk are followed by the next remote run."""
    shared = SharedRemote(16)
    writer, reader = make_engine(shared), make_engine(shared, has_disk=False)
    writer.store_chunks(ks(1, 2, 4, 5))
    writer.settle()
    reader.index.prepare_store(ks(3))  # stored without a remote write
    reader.index.complete_store(ks(3), True)
    assert shared.exists(ks(1, 2, 3, 4, 5)) == [True, True, False, True, True]
    remote, cpu = Tier.REMOTE, Tier.CPU
    assert reader.lookup("r1", ks(1, 2, 3, 4, 5)) == (remote, remote, cpu, remote, remote)
    reader.pipeline.forget("r1")


def test_a_remote_eviction_is_reported_removed_by_the_engine_whose_write_caused_it() -> None:
    shared = SharedRemote(2)
    first, second = make_engine(shared), make_engine(shared)
    first.store_chunks(ks(1, 2))
    first.settle()
    second.store_chunks(ks(3))
    second.settle()
    removed = [e for e in second.observer.events if isinstance(e, ChunkRemoved)]
    assert [(e.tier, e.keys, e.reason) for e in removed] == [(Tier.REMOTE, (k(1),), "evicted")]
    assert first.events(ChunkRemoved, Tier.REMOTE) == []
    assert second.lookup("r1", ks(1, 2)) == ()  # 1 is gone: the prefix starts with a miss


def test_fetched_rows_come_from_the_requests_room_only() -> None:
    """Two CPU rows, three remote chunks: the first two are fetched, held and served."""
    shared = SharedRemote(16)
    writer, reader = make_engine(shared), make_engine(shared, num_cpu_rows=2)
    writer.store_chunks(ks(1, 2, 3))
    writer.settle()
    assert reader.lookup("r1", ks(1, 2, 3)) == (Tier.REMOTE, Tier.REMOTE)
    assert reader.index.stats().num_holds == 2
    plan = reader.pipeline.prepare_load("r1", ks(1, 2))
    reader.pipeline.complete_load(plan.keys, ok=True)
    reader.pipeline.forget("r1")
    reader.settle()
    stats = reader.index.stats()
    assert stats.num_holds == 0 and stats.cpu.num_pinned == 0
    reader.index.check_invariants()


def test_the_engine_s_own_hits_are_accesses_in_every_tier() -> None:
    """`record_engine_hit` (a prefix the engine's cache served) touches the chunks in CPU, on
    disk and in the remote tier, so each tier's LRU evicts other chunks first."""
    shared = SharedRemote(4)
    engine = make_engine(shared, num_cpu_rows=4)
    engine.store_chunks(ks(1, 2, 3, 4))
    engine.settle()
    engine.pipeline.record_engine_hit(ks(1))
    engine.settle()
    engine.store_chunks(ks(5))  # each tier is full: one chunk must go
    engine.settle()
    assert engine.index.ready_keys(Tier.CPU) == frozenset(ks(1, 3, 4, 5))
    assert engine.events(ChunkRemoved, Tier.REMOTE) == ks(2)
    assert shared.exists(ks(1, 2)) == [True, False]


def test_an_idle_poll_waits_only_while_a_requester_waits_on_io(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`poll(wait_s)` (an engine step with nothing to compute) blocks for the service's first
    answer only while a probe or fetch is in flight for someone; otherwise it returns at once."""
    shared = SharedRemote(16)
    writer, reader = make_engine(shared), make_engine(shared, has_disk=False)
    writer.store_chunks(ks(1, 2))
    writer.settle()
    timeouts: list[float] = []
    drain = reader.service.drain_completions

    def recording(timeout_s: float = 0.0) -> list[Completion]:
        timeouts.append(timeout_s)
        return drain(timeout_s)

    monkeypatch.setattr(reader.service, "drain_completions", recording)
    reader.pipeline.poll(wait_s=0.005)
    assert not reader.pipeline.is_waiting and timeouts == [0.0]
    assert reader.pipeline.prepare_lookup("r1", ks(1, 2)).is_pending  # the probe is queued
    assert reader.pipeline.is_waiting
    timeouts.clear()
    reader.pipeline.poll(wait_s=0.005)
    reader.pipeline.poll()  # a step with tokens to compute never waits
    assert timeouts == [0.005, 0.0]
    assert reader.lookup("r1", ks(1, 2)) == (Tier.REMOTE,) * 2
    assert not reader.pipeline.is_waiting
    reader.pipeline.release("r1")
    reader.pipeline.forget("r1")


@pytest.mark.parametrize(("promotion_wait_s", "is_answered_at_once"), [(0.0, False), (5.0, True)])
def test_a_fast_remote_answers_the_lookup_that_asked_within_the_wait(
    monkeypatch: pytest.MonkeyPatch, promotion_wait_s: float, is_answered_at_once: bool
) -> None:
    """Probe and fetch are waited for in the lookup, within `promotion_wait_s` in all (as a
    disk promotion is): a link that answers in time costs the request no scheduler steps."""
    shared = SharedRemote(16)
    writer = make_engine(shared)
    reader = make_engine(shared, has_disk=False, promotion_wait_s=promotion_wait_s)
    writer.store_chunks(ks(1, 2, 3))
    writer.settle()
    drain = reader.service.drain_completions
    waits: list[float] = []

    def answering(timeout_s: float = 0.0) -> list[Completion]:  # a service thread that answers
        if timeout_s > 0:
            waits.append(timeout_s)
            reader.service.run_pending()
        return drain(timeout_s)

    monkeypatch.setattr(reader.service, "drain_completions", answering)
    answer = reader.pipeline.prepare_lookup("r1", ks(1, 2, 3))
    assert answer.is_pending is not is_answered_at_once
    if is_answered_at_once:
        assert answer.tiers == (Tier.REMOTE,) * 3
        assert len(waits) == 2 and all(0 < wait <= promotion_wait_s for wait in waits)
    else:
        assert waits == [] and reader.lookup("r1", ks(1, 2, 3)) == (Tier.REMOTE,) * 3
