"""Shared helpers for the index tests."""

from __future__ import annotations

from collections.abc import Iterable

from kvstore.events import ChunkRemoved, ChunkStored, TierEvent
from kvstore.index import IndexConfig, TierIndex
from kvstore.keys import BlockKey, Tier

CHUNK_BYTES = 100
TOKENS = 4


def k(i: int) -> BlockKey:
    return BlockKey(i.to_bytes(4, "big"))


def ks(*numbers: int) -> list[BlockKey]:
    return [k(i) for i in numbers]


class FakeClock:
    def __init__(self) -> None:
        self.now_s = 1000.0

    def __call__(self) -> float:
        self.now_s += 1.0
        return self.now_s


def make_index(num_cpu_rows: int = 4, num_disk_chunks: int = 0, **overrides: object) -> TierIndex:
    config = IndexConfig(
        num_cpu_rows=num_cpu_rows,
        chunk_bytes=CHUNK_BYTES,
        num_tokens_per_chunk=TOKENS,
        disk_capacity_bytes=num_disk_chunks * CHUNK_BYTES,
        **overrides,  # type: ignore[arg-type]
    )
    return TierIndex(config, clock=FakeClock())


def store(index: TierIndex, keys: list[BlockKey]) -> None:
    """Store keys to CPU (all must fit) and complete successfully."""
    plan = index.prepare_store(keys)
    assert plan is not None and plan.num_skipped == 0
    index.complete_store(plan.keys, success=True)


def write_through(index: TierIndex) -> list[BlockKey]:
    plan = index.plan_write_through()
    index.complete_write_through(plan.keys, success=True)
    return list(plan.keys)


class ContractViolation(AssertionError):
    pass


def replay(
    events: Iterable[TierEvent], state: dict[Tier, set[BlockKey]] | None = None
) -> dict[Tier, set[BlockKey]]:
    """Apply events to per-tier membership, checking the event contract as it goes."""
    members = state if state is not None else {Tier.CPU: set(), Tier.DISK: set()}
    for event in events:
        present = members[event.tier]
        if isinstance(event, ChunkStored):
            for key in event.keys:
                if key in present:
                    raise ContractViolation(f"{key.hex()} stored twice in {event.tier}")
                present.add(key)
            if event.token_ids is not None:
                assert len(event.token_ids) == len(event.keys) * event.num_tokens_per_chunk
        else:
            assert isinstance(event, ChunkRemoved)
            for key in event.keys:
                if key not in present:
                    raise ContractViolation(f"{key.hex()} removed from {event.tier} unreported")
                present.remove(key)
    return members


def take_candidates(index: TierIndex) -> list[BlockKey]:
    """The chunks `plan_write_through()` would write now (planned, then abandoned)."""
    plan = index.plan_write_through()
    index.complete_write_through(plan.keys, False)
    return list(plan.keys)
