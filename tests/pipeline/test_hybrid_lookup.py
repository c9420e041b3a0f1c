"""A hybrid engine's lookups across tiers (`kvstore.vllm.hybrid_lookup`), on the pipeline with
an in-memory disk and a shared in-memory remote tier: one replica stores, another looks up."""

from __future__ import annotations

from kvstore.keys import BlockKey, Tier
from kvstore.service.inline_remote import SharedRemote
from kvstore.vllm.geometry import FULL, SLIDING, KVGroup
from kvstore.vllm.hybrid import HybridPlanner
from kvstore.vllm.hybrid_lookup import HybridAnswer, HybridLookups

from .test_pipeline_ops import TOKENS
from .test_pipeline_remote import Engine, make_engine

# a sliding-window group that reaches one chunk back, and a full-attention group; windows are
# kept before every second chunk boundary
PLANNER = HybridPlanner(
    (KVGroup(0, SLIDING, TOKENS + 1, ("s",)), KVGroup(1, FULL, 0, ("f",))), TOKENS, 2
)
CHUNKS = [BlockKey(i.to_bytes(7, "big")) for i in range(1, 7)]  # a prompt of 6 full chunks


def store(engine: Engine, entries: list[tuple[int, int]]) -> None:
    engine.store_chunks([PLANNER.key(CHUNKS[chunk], g) for chunk, g in entries])
    engine.settle()


def lookup(engine: Engine, lookups: HybridLookups, owner: str, start: int = 0) -> HybridAnswer:
    for _ in range(10):
        answer = lookups.lookup(owner, CHUNKS[start:], start)
        if not answer.is_pending:
            return answer
        assert engine.service.run_pending(), "pending with nothing queued"
    raise AssertionError("still pending after 10 rounds")


def test_the_local_tiers_serve_the_longest_boundary_every_group_has() -> None:
    engine = make_engine(SharedRemote(64), num_cpu_rows=16)
    store(engine, [(c, 1) for c in range(6)] + [(1, 0), (3, 0)])
    lookups = HybridLookups(PLANNER, engine.pipeline)
    # no remote holds more: boundary 4 (full 0-3, window chunk 3) is the hit
    answer = lookup(engine, lookups, "r1")
    assert answer.entries == ((0, 1), (1, 1), (2, 1), (3, 0), (3, 1))
    assert answer.tiers == (Tier.CPU,) * 5
    ((num_chunks, num_tokens, hits),) = engine.observer.lookups
    assert (num_chunks, num_tokens) == (6, 6 * TOKENS)
    assert hits[Tier.CPU] == (4, 4 * TOKENS)  # four chunks of tokens, not five entries


def test_a_fresh_replica_tries_the_prompts_end_then_the_retained_boundary_remotely() -> None:
    shared = SharedRemote(64)
    first = make_engine(shared, num_cpu_rows=16)
    store(first, [(c, 1) for c in range(6)] + [(1, 0), (3, 0), (4, 0)])
    second = make_engine(shared, num_cpu_rows=16)
    lookups = HybridLookups(PLANNER, second.pipeline)
    # boundary 6 needs the window chunk 5, which nobody stored: boundary 4 is served remotely
    answer = lookup(second, lookups, "r1")
    assert [chunk for chunk, _ in answer.entries] == [0, 1, 2, 3, 3]
    assert answer.tiers == (Tier.REMOTE,) * 5
    ((_, _, hits),) = second.observer.lookups  # counted once, the final answer
    assert hits[Tier.REMOTE] == (4, 4 * TOKENS)
    second.pipeline.release("r1")
    # the whole prompt is served once its last window is there too
    store(first, [(5, 0)])
    answer = lookup(second, lookups, "r2")
    assert answer.entries[-2:] == ((5, 0), (5, 1)) and len(answer.entries) == 7


def test_a_miss_everywhere_is_a_lookup_without_a_hit() -> None:
    engine = make_engine(SharedRemote(64), num_cpu_rows=16)
    lookups = HybridLookups(PLANNER, engine.pipeline)
    assert lookup(engine, lookups, "r1") == HybridAnswer()
    ((num_chunks, _, hits),) = engine.observer.lookups
    assert num_chunks == 6 and all(h == (0, 0) for h in hits.values())
