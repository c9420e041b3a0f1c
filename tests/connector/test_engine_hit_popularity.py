"""A prefix that vLLM's own prefix cache keeps serving counts as used in kvstore's tiers: it is
not aged out of the disk tier by a flood of unique prompts while the engine hides its use
(issue 25), so a restarted engine finds it. Under vLLM's own `Scheduler` (`vllm_loop`).

Without the engine's hits, kvstore's LRUs see the hottest prefix as its oldest: they evict it,
the next request that has it copies it out of the engine's blocks again (a chunk missing from
the CPU tier is stored), and a restart between the two finds it gone from disk."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvstore.index.table import EntryState
from kvstore.keys import BlockKey, Tier
from kvstore.pipeline import TierPipeline

from .vllm_loop import BLOCK, Loop, make_loop

CHUNK_BYTES = 2 * 2 * BLOCK * 2 * 32 * 4  # layers x (K, V) x tokens x heads x head size x fp32
CPU_CHUNKS = 6
DISK_CHUNKS = 12
FLOOD = 8  # unique prompts of 3 chunks each: twice what the disk tier holds


def prompt(seed: int) -> list[int]:
    return [(seed * 7919 + i * 31) % 400 + 1 for i in range(3 * BLOCK + 5)]


def on_disk(loop: Loop, keys: list[BlockKey]) -> list[bool]:
    index = loop.connector.runtime.index
    assert index is not None
    return [index.state_of(Tier.DISK, key) is EntryState.READY for key in keys]


def settle(loop: Loop) -> None:
    """The queued disk writes land and the pipeline applies them."""
    runtime = loop.connector.runtime
    assert runtime.service is not None and runtime.pipeline is not None
    assert runtime.service.wait_idle(timeout_s=60)
    runtime.pipeline.settle()


def disk_hit_tokens(loop: Loop) -> float:
    registry = loop.connector.runtime.registry
    return registry.get_sample_value("kvstore_hit_tokens_total", {"tier": "disk"}) or 0.0


def stored_chunks(loop: Loop, tier: str) -> float:
    registry = loop.connector.runtime.registry
    return registry.get_sample_value("kvstore_stored_chunks_total", {"tier": tier}) or 0.0


def run_flood(loop: Loop) -> tuple[list[BlockKey], list[BlockKey], int]:
    """`hot` is stored first, then `cold`; unique prompts follow, each after a request that
    the engine serves `hot`'s prefix to from its own cache. Returns both prompts' keys and the
    fewest of hot's chunks the disk held after any unique prompt."""
    hot = loop.add("hot-0", prompt(1), max_tokens=2)
    loop.run()
    cold = loop.add("cold", prompt(2), max_tokens=2)
    loop.run()
    keys = loop.connector.scheduler.chunk_keys
    hot_keys, cold_keys = keys(hot), keys(cold)
    assert len(hot_keys) == len(cold_keys) == 3
    fewest_on_disk = len(hot_keys)
    for i in range(FLOOD):
        # Each request's disk writes land before the next request: the writer runs at idle
        # priority, and on a busy machine the rows its queued writes pin could leave a store
        # no room in the CPU tier (a chunk not copied, which this test counts).
        loop.add(f"hot-{i + 1}", prompt(1), max_tokens=2)
        loop.run()
        settle(loop)
        loop.add(f"unique-{i}", prompt(100 + i), max_tokens=2)
        loop.run()
        settle(loop)
        fewest_on_disk = min(fewest_on_disk, sum(on_disk(loop, hot_keys)))
    assert loop.hit_tokens() == 0  # every hot prefix came from the engine's cache, not kvstore
    return hot_keys, cold_keys, fewest_on_disk


@pytest.mark.parametrize("counts_engine_hits", [True, False], ids=["engine-hits", "ignored"])
def test_a_prefix_the_engine_keeps_serving_survives_a_flood_and_a_restart(
    tiny_model_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    counts_engine_hits: bool,
) -> None:
    """`ignored` is the control: the engine's hits not recorded (what this guards against)."""
    if not counts_engine_hits:
        monkeypatch.setattr(TierPipeline, "record_engine_hit", lambda self, keys: None)
    store = {"cpu_bytes": CPU_CHUNKS * CHUNK_BYTES, "disk_path": str(tmp_path / "store"),
             "disk_bytes": DISK_CHUNKS * CHUNK_BYTES}  # fmt: skip
    loop = make_loop(tiny_model_dir, tmp_path / "first", monkeypatch, **store)
    try:
        hot_keys, cold_keys, fewest_on_disk = run_flood(loop)
        assert not any(on_disk(loop, cold_keys))  # the flood did evict
        num_stored = stored_chunks(loop, "cpu")
    finally:
        loop.close()
    if not counts_engine_hits:
        # Aged out of the disk tier between uses, and copied from the engine again each time
        # the CPU tier had dropped it: a restart at the wrong moment finds it gone.
        assert fewest_on_disk < len(hot_keys)
        assert num_stored > 3 * (FLOOD + 2)
        return
    assert fewest_on_disk == len(hot_keys)  # on disk throughout the flood
    assert num_stored == 3 * (FLOOD + 2)  # each prompt's chunks copied once, hot's included
    restarted = make_loop(tiny_model_dir, tmp_path / "second", monkeypatch, **store)
    try:
        restarted.add("hot-after-restart", prompt(1), max_tokens=2)
        restarted.run()
        assert disk_hit_tokens(restarted) == 3 * BLOCK
        assert restarted.num_bad_positions == 0
    finally:
        restarted.close()
