"""kvstore's events and counters in vLLM's own classes and channels (the release under test):
`BlockStored`/`BlockRemoved` for vLLM's KV-events publisher, and `vllm:kvstore_*` counters
through the connector-stats channel."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from vllm.distributed.kv_events import (
    MEDIUM_CPU,
    MEDIUM_STORAGE,
    BlockRemoved,
    BlockStored,
    KVEventBatch,
)
from vllm.v1.core.kv_cache_utils import maybe_convert_block_hash

from kvstore.events import ChunkRemoved, ChunkStored
from kvstore.keys import BlockKey, Tier, group_key
from kvstore.vllm.events import to_vllm_events
from kvstore.vllm.geometry import FULL, SLIDING, KVGroup
from kvstore.vllm.vllm_metrics import KVStoreConnectorStats, KVStorePromMetrics, StepCounters

from .vllm_loop import vllm_config

KEYS = (BlockKey(b"\x01" * 32), BlockKey(b"\x02" * 32))


def test_events_are_vllms_and_survive_its_wire_format() -> None:
    events = to_vllm_events(
        [
            ChunkStored(Tier.CPU, KEYS, 16, 1.0, parent_key=None, token_ids=tuple(range(32))),
            ChunkStored(Tier.DISK, KEYS[1:], 16, 2.0, parent_key=KEYS[0], token_ids=None),
            ChunkRemoved(Tier.CPU, KEYS[:1], 3.0),
        ]
    )
    stored, on_disk, removed = events
    assert isinstance(stored, BlockStored) and isinstance(removed, BlockRemoved)
    hashes = [maybe_convert_block_hash(key) for key in KEYS]  # as vLLM publishes its own
    assert stored.block_hashes == hashes and stored.parent_block_hash is None
    assert (stored.medium, on_disk.medium) == (MEDIUM_CPU, MEDIUM_STORAGE)
    assert removed.medium == MEDIUM_CPU and removed.block_hashes == hashes[:1]
    assert stored.token_ids == list(range(32)) and stored.block_size == 16
    assert on_disk.parent_block_hash == hashes[0]
    # vLLM >= 0.33: plain prefix hashes carry no lookahead tokens
    assert getattr(stored, "lookahead_token_ids", None) is None
    wire = msgspec.msgpack.encode(KVEventBatch(ts=4.0, events=events))
    decoded = msgspec.msgpack.decode(wire, type=KVEventBatch)
    assert decoded.events == events


def test_a_hybrid_engines_events_carry_vllms_block_hash_and_the_group() -> None:
    groups = (
        KVGroup(0, SLIDING, 64, ("l0",), "sliding_window"),
        KVGroup(1, FULL, 0, ("l1",), "full_attention"),
    )
    full = [group_key(key, 1, 2) for key in KEYS]
    sliding = group_key(KEYS[1], 0, 2)
    events = to_vllm_events(
        [
            # a disk write batch may mix groups: one event per run of one group's entries
            ChunkStored(Tier.DISK, (*full, sliding), 16, 1.0, token_ids=tuple(range(48))),
            ChunkStored(Tier.CPU, (sliding,), 16, 2.0, parent_key=group_key(KEYS[0], 0, 2)),
            ChunkRemoved(Tier.CPU, (full[0], sliding), 3.0),
        ],
        groups,
    )
    hashes = [maybe_convert_block_hash(key) for key in KEYS]
    stored_full, stored_sliding, on_cpu, removed_full, removed_sliding = events
    assert isinstance(stored_full, BlockStored) and isinstance(stored_sliding, BlockStored)
    assert stored_full.block_hashes == hashes and stored_sliding.block_hashes == hashes[1:]
    assert (stored_full.group_idx, stored_full.kv_cache_spec_kind) == (1, "full_attention")
    assert stored_full.kv_cache_spec_sliding_window is None
    assert (stored_sliding.group_idx, stored_sliding.kv_cache_spec_sliding_window) == (0, 64)
    assert stored_full.token_ids == list(range(32)) and stored_sliding.token_ids == list(
        range(32, 48)
    )
    assert isinstance(on_cpu, BlockStored) and on_cpu.parent_block_hash == hashes[0]
    assert isinstance(removed_full, BlockRemoved) and removed_full.block_hashes == hashes[:1]
    assert isinstance(removed_sliding, BlockRemoved)
    assert removed_sliding.block_hashes == hashes[1:]


def test_step_counters_reach_vllms_prometheus_metrics(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    registry = CollectorRegistry()

    def bound(cls: type) -> type:
        class InRegistry(cls):  # type: ignore[misc,valid-type]
            def __init__(self, *args: object, **kwargs: object) -> None:
                super().__init__(*args, registry=registry, **kwargs)  # type: ignore[arg-type]

        return InRegistry

    counters = StepCounters()
    counters.add_events([ChunkStored(Tier.CPU, KEYS, 16, 1.0)])
    counters.record_load_failure(3)
    stats = counters.take()
    assert stats is not None and counters.take() is None
    other = KVStoreConnectorStats(data={"stored_chunks/cpu": 1})
    merged = stats.aggregate(other)
    assert merged.reduce() == {"load_failed_chunks": 3, "stored_chunks/cpu": 3}
    metrics = KVStorePromMetrics(
        vllm_config(tiny_model_dir, tmp_path, monkeypatch),
        {Counter: bound(Counter), Gauge: bound(Gauge), Histogram: bound(Histogram)},
        ["model_name", "engine"],
        {0: ["tiny", "0"]},
    )
    metrics.observe(merged.reduce(), engine_idx=0)
    labels = {"model_name": "tiny", "engine": "0"}
    sample = registry.get_sample_value
    assert sample("vllm:kvstore_stored_chunks_total", {**labels, "tier": "cpu"}) == 3
    assert sample("vllm:kvstore_load_failed_chunks_total", labels) == 3
