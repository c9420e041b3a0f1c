"""Chained keys, trace loading, and the simulator against hand-driven replays."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from kvstore.events import ChunkRemoved
from kvstore.index import IndexConfig, TierIndex
from kvstore.keys import Tier
from kvstore.simulate import (
    SimulationResult,
    TraceFormatError,
    chunk_keys,
    load_trace,
    simulate,
    sweep,
)

TOKENS = 16
CHUNK_BYTES = 1024


def multi_turn_trace(
    num_conversations: int, num_turns: int, num_turn_tokens: int, seed: int = 0
) -> list[list[int]]:
    """Conversations interleaved turn by turn; each prompt is the whole history so far."""
    rng = random.Random(seed)
    system = [rng.randrange(32_000) for _ in range(2 * TOKENS)]
    histories = [list(system) for _ in range(num_conversations)]
    trace: list[list[int]] = []
    for _ in range(num_turns):
        for history in histories:
            history.extend(rng.randrange(32_000) for _ in range(num_turn_tokens))
            trace.append(list(history))
    return trace


def scan_polluted_trace(seed: int = 0) -> list[list[int]]:
    """Three hot prompts (12 chunks), used twice to warm up, then again after every 12 chunks of
    one-time prompts (scans): an LRU reuse distance of 24 chunks."""
    rng = random.Random(seed)
    hot = [[rng.randrange(32_000) for _ in range(4 * TOKENS)] for _ in range(3)]
    trace: list[list[int]] = hot + hot
    for _ in range(40):
        for _ in range(2):
            trace.append([rng.randrange(32_000) for _ in range(6 * TOKENS)])
        trace.extend(hot)
    return trace


# chunk_keys


def test_chunk_keys_chain_over_full_chunks() -> None:
    tokens = list(range(50))
    keys = chunk_keys(tokens, TOKENS)
    assert len(keys) == 3 and len(set(keys)) == 3
    assert chunk_keys([*tokens[:48], 7, 7], TOKENS) == keys  # the partial chunk has no key
    assert chunk_keys(tokens[:32], TOKENS) == keys[:2]
    changed = [99, *tokens[1:]]
    assert not set(chunk_keys(changed, TOKENS)) & set(keys)  # every key covers its prefix
    with pytest.raises(ValueError, match="got 0"):
        chunk_keys(tokens, 0)


# load_trace


def test_load_trace_reads_jsonl(tmp_path: Path) -> None:
    path = tmp_path / "trace.jsonl"
    path.write_text('{"prompt_token_ids": [1, 2, 3]}\n\n{"prompt_token_ids": [], "x": 1}\n')
    assert load_trace(path) == [[1, 2, 3], []]


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("{oops", r"trace.jsonl:2: not JSON"),
        ('{"prompt": [1]}', r"trace.jsonl:2: expected an object with \"prompt_token_ids\""),
        ('{"prompt_token_ids": [1, "a"]}', r"trace.jsonl:2: prompt_token_ids must all be integers"),
    ],
)
def test_load_trace_names_the_bad_line(tmp_path: Path, line: str, message: str) -> None:
    path = tmp_path / "trace.jsonl"
    path.write_text(json.dumps({"prompt_token_ids": [1]}) + "\n" + line + "\n")
    with pytest.raises(TraceFormatError, match=message):
        load_trace(path)


# simulate


def run(trace: list[list[int]], **overrides: object) -> SimulationResult:
    options: dict[str, object] = {
        "num_tokens_per_chunk": TOKENS,
        "cpu_rows": 8,
        "disk_bytes": 0,
        "chunk_bytes": CHUNK_BYTES,
        "policy": "lru",
    }
    options.update(overrides)
    return simulate(trace, **options)  # type: ignore[arg-type]


def test_multi_turn_history_is_served_from_disk_when_cpu_is_too_small() -> None:
    # 4 conversations of up to 20 chunks each: 80 chunks of history for 24 CPU rows.
    trace = multi_turn_trace(num_conversations=4, num_turns=6, num_turn_tokens=3 * TOKENS)
    cpu_only = run(trace, cpu_rows=24)
    with_disk = run(trace, cpu_rows=24, disk_bytes=1000 * CHUNK_BYTES)
    assert with_disk.num_disk_hit_chunks > 0, with_disk
    assert with_disk.num_promoted_chunks == with_disk.num_disk_hit_chunks
    assert with_disk.num_hit_chunks > 2 * cpu_only.num_hit_chunks, (cpu_only, with_disk)
    # With room on disk only new text misses: 3 chunks a turn, and the shared system prompt once.
    assert with_disk.num_miss_chunks == 3 * len(trace) + 2, with_disk
    assert with_disk.num_disk_hit_tokens == with_disk.num_disk_hit_chunks * TOKENS


def test_arc_beats_lru_on_a_scan_polluted_trace() -> None:
    trace = scan_polluted_trace()
    results = {
        policy: simulate(
            trace,
            num_tokens_per_chunk=TOKENS,
            cpu_rows=20,
            disk_bytes=0,
            chunk_bytes=CHUNK_BYTES,
            policy=policy,
        )
        for policy in ("lru", "arc")
    }
    lru, arc = results["lru"].num_cpu_hit_chunks, results["arc"].num_cpu_hit_chunks
    assert arc > lru, f"ARC hits {arc} chunks, LRU {lru}: ARC should keep the hot prompts"


def test_engine_cache_takes_its_hits_first() -> None:
    trace = multi_turn_trace(num_conversations=1, num_turns=4, num_turn_tokens=2 * TOKENS)
    result = simulate(
        trace,
        num_tokens_per_chunk=TOKENS,
        cpu_rows=64,
        disk_bytes=0,
        chunk_bytes=CHUNK_BYTES,
        policy="lru",
        engine_chunks=1000,
    )
    assert result.num_engine_hit_chunks > 0 and result.num_hit_chunks == 0
    assert result.num_miss_chunks == result.num_stored_chunks


def hand_replay(trace: list[list[int]], config: IndexConfig) -> dict[str, int]:
    """The connector's steps, written out one by one."""
    index = TierIndex(config, clock=lambda: 0.0)
    counts = {"cpu": 0, "disk": 0, "promoted": 0, "stored": 0, "written": 0, "evicted_cpu": 0}
    for prompt in trace:
        keys = chunk_keys(prompt, TOKENS)
        found = index.lookup(keys)
        counts["cpu"] += found.num_cpu_hits
        counts["disk"] += found.num_disk_hits
        promotion = index.plan_promotion(found.keys)
        assert promotion.num_skipped == 0
        index.complete_promotion(promotion.keys, success=True)
        counts["promoted"] += len(promotion.keys)
        load = index.prepare_load(found.keys)
        assert load.missing == ()
        index.release(found.keys)
        index.complete_load(load.keys)
        misses = keys[found.num_hits :]
        if misses:
            plan = index.prepare_store(
                misses,
                token_ids=prompt[found.num_hits * TOKENS : len(keys) * TOKENS],
                parent_key=keys[found.num_hits - 1] if found.num_hits else None,
            )
            if plan is not None:
                index.complete_store(plan.keys, success=True)
                counts["stored"] += len(plan.keys)
        write = index.plan_write_through()
        index.complete_write_through(write.keys, success=True)
        counts["written"] += len(write.keys)
        for event in index.take_events():
            if isinstance(event, ChunkRemoved) and event.tier is Tier.CPU:
                counts["evicted_cpu"] += len(event.keys)
        index.check_invariants()
    return counts


@pytest.mark.parametrize("policy", ["lru", "arc"])
def test_simulate_matches_a_hand_driven_replay(policy: str) -> None:
    trace = multi_turn_trace(num_conversations=3, num_turns=5, num_turn_tokens=2 * TOKENS, seed=3)
    trace += scan_polluted_trace(seed=4)[:20]
    config = IndexConfig(
        num_cpu_rows=12,
        chunk_bytes=CHUNK_BYTES,
        num_tokens_per_chunk=TOKENS,
        disk_capacity_bytes=40 * CHUNK_BYTES,
        cpu_policy=policy,
        disk_policy=policy,
    )
    by_hand = hand_replay(trace, config)
    result = simulate(
        trace,
        num_tokens_per_chunk=TOKENS,
        cpu_rows=12,
        disk_bytes=40 * CHUNK_BYTES,
        chunk_bytes=CHUNK_BYTES,
        policy=policy,
    )
    simulated = {
        "cpu": result.num_cpu_hit_chunks,
        "disk": result.num_disk_hit_chunks,
        "promoted": result.num_promoted_chunks,
        "stored": result.num_stored_chunks,
        "written": result.num_written_chunks,
        "evicted_cpu": result.num_cpu_evicted_chunks,
    }
    assert simulated == by_hand
    assert by_hand["disk"] > 0 and by_hand["cpu"] > 0


def test_sweep_nests_policy_then_cpu_then_disk() -> None:
    trace = multi_turn_trace(num_conversations=2, num_turns=3, num_turn_tokens=TOKENS)
    rows = sweep(
        trace,
        num_tokens_per_chunk=TOKENS,
        cpu_rows=[4, 16],
        disk_bytes=[0, 64 * CHUNK_BYTES],
        chunk_bytes=CHUNK_BYTES,
        policies=["lru", "arc"],
    )
    assert [(r.policy, r.num_cpu_rows, r.disk_capacity_bytes) for r in rows] == [
        (policy, rows_, size)
        for policy in ("lru", "arc")
        for rows_ in (4, 16)
        for size in (0, 64 * CHUNK_BYTES)
    ]
    row = rows[0].as_row()
    assert row["policy"] == "lru" and "hit_ratio" in row and "num_miss_chunks" in row
    assert all(r.num_requests == len(trace) for r in rows)
