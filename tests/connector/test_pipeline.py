"""KVStoreConnector inside the real vLLM CPU engine: loads from CPU and disk are exact (the KV
they put into the engine equals what an engine without kvstore computes, block by block)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from kvstore.keys import Tier
from kvstore.tiny_model import TinyLlamaSpec
from kvstore.vllm.engine import engine, generate_runs, kv_transfer_config, scheduler_connector
from kvstore.vllm.kv_probe import computed_kv, loaded_kv
from tests.support.connector import drain, kvstore_summary
from tests.support.oracle import assert_audited, assert_kv_equal, assert_same_outputs

pytestmark = pytest.mark.engine

CHUNK_BYTES = TinyLlamaSpec().kv_bytes_per_token * 32  # one 32-token block, every layer
PROMPT_A = [(7 * i + 3) % 500 + 5 for i in range(200)]  # 6 full chunks before the last token
PROMPT_B = [(11 * i + 1) % 500 + 5 for i in range(200)]
HIT_TOKENS = 192


@pytest.fixture(scope="module")
def baseline(tiny_model_dir: Path) -> dict[str, Any]:
    """Greedy runs without any connector: a cold run, then one from vLLM's prefix cache; and
    the KV it computed for every block of the prompts."""
    with engine(tiny_model_dir) as llm, computed_kv(llm) as computed:
        _, cold = generate_runs(llm, [PROMPT_A, PROMPT_B])
        _, warm = generate_runs(llm, [PROMPT_A, PROMPT_B])
    return {"cold": cold, "warm": warm, "kv": computed.blocks}


def _check_clean(llm: Any) -> None:
    drain(llm)
    connector = scheduler_connector(llm)
    index = connector.runtime.index
    index.check_invariants()
    stats = index.stats()
    assert stats.cpu.num_pinned == 0
    assert stats.disk is None or stats.disk.num_pinned == 0
    assert connector.scheduler.num_inflight_jobs == 0


def test_cpu_tier_hit_is_exact(tiny_model_dir: Path, baseline: dict[str, Any]) -> None:
    config = kv_transfer_config(cpu_bytes=64 * CHUNK_BYTES, audit_loads=True)
    with engine(tiny_model_dir, kv_transfer=config, disable_log_stats=False) as llm:
        _, first = generate_runs(llm, [PROMPT_A])
        drain(llm)
        assert llm.reset_prefix_cache()  # forget the engine's own copy: only kvstore has it
        with loaded_kv(llm) as loaded:
            second, second_runs = generate_runs(llm, [PROMPT_A])
        summary = kvstore_summary(llm)
        vllm_metrics = {m.name: m for m in llm.get_metrics()}
        _check_clean(llm)
    assert_same_outputs(baseline["cold"][:1], first)
    assert_same_outputs(baseline["warm"][:1], second_runs)
    assert_audited(summary, verified=6)
    assert_kv_equal(baseline["kv"], loaded, num_blocks=6)
    assert summary["tiers"]["cpu"]["hit_tokens"] == HIT_TOKENS
    assert summary["tiers"]["disk"]["hit_tokens"] == 0
    assert second[0].num_cached_tokens == HIT_TOKENS
    external = vllm_metrics["vllm:external_prefix_cache_hits"]
    assert external.value == HIT_TOKENS  # type: ignore[attr-defined]


def test_disk_tier_hit_is_exact(
    tiny_model_dir: Path, baseline: dict[str, Any], tmp_path: Path
) -> None:
    # 8 CPU rows: PROMPT_B's 6 chunks push most of PROMPT_A's out, so A must come from LMDB.
    config = kv_transfer_config(
        cpu_bytes=8 * CHUNK_BYTES,
        disk_path=str(tmp_path / "store"),
        disk_bytes=64 * CHUNK_BYTES,
        audit_loads=True,
    )
    with engine(tiny_model_dir, kv_transfer=config) as llm:
        generate_runs(llm, [PROMPT_A])
        drain(llm)
        generate_runs(llm, [PROMPT_B])
        drain(llm)
        assert llm.reset_prefix_cache()
        with loaded_kv(llm) as loaded:
            _, again = generate_runs(llm, [PROMPT_A])
        summary = kvstore_summary(llm)
        _check_clean(llm)
        index = scheduler_connector(llm).runtime.index
        assert len(index.ready_keys(Tier.DISK)) == 12
    assert_same_outputs(baseline["warm"][:1], again)
    assert_audited(summary, verified=6)  # disk chunks too: promoted into rows, then loaded
    assert_kv_equal(baseline["kv"], loaded, num_blocks=6)
    tiers = summary["tiers"]
    assert tiers["disk"]["hit_tokens"] > 0, summary
    assert tiers["cpu"]["hit_tokens"] + tiers["disk"]["hit_tokens"] == HIT_TOKENS
    assert summary["bytes"]["disk_to_cpu"] == tiers["disk"]["hit_chunks"] * CHUNK_BYTES


def test_partial_first_chunk_loads_only_missing_blocks(
    tiny_model_dir: Path, baseline: dict[str, Any]
) -> None:
    """64-token chunks over 32-token engine blocks: the engine holds the first block of chunk 0,
    kvstore loads the rest of that chunk (from its second block on) and the chunks after it."""
    config = kv_transfer_config(cpu_bytes=64 * CHUNK_BYTES, block_size=64, audit_loads=True)
    with engine(tiny_model_dir, kv_transfer=config) as llm:
        generate_runs(llm, [PROMPT_A])
        drain(llm)
        assert llm.reset_prefix_cache()
        generate_runs(llm, [PROMPT_A[:40]])  # the engine caches block 0 of PROMPT_A again
        drain(llm)
        with loaded_kv(llm) as loaded:
            outputs, runs = generate_runs(llm, [PROMPT_A])
        summary = kvstore_summary(llm)
        _check_clean(llm)
    assert_same_outputs(baseline["warm"][:1], runs)
    assert_audited(summary, verified=3)  # the partial first chunk included
    assert_kv_equal(baseline["kv"], loaded, num_blocks=5)  # the blocks kvstore filled
    assert outputs[0].num_cached_tokens == 192
    assert summary["tiers"]["cpu"]["hit_chunks"] == 3
    assert summary["tiers"]["cpu"]["hit_tokens"] == 160  # what the engine did not have
    assert summary["bytes"]["cpu_to_engine"] == 5 * CHUNK_BYTES  # 5 of the 6 blocks moved


def test_unstable_hash_seed_warns_and_is_exported(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """xxhash without PYTHONHASHSEED seeds vLLM's hash chain randomly per process: keys would
    change on restart, so kvstore says how to fix it and exports kvstore_keys_stable 0."""
    monkeypatch.delenv("PYTHONHASHSEED", raising=False)
    config = kv_transfer_config(cpu_bytes=64 * CHUNK_BYTES)
    with (
        caplog.at_level("WARNING", logger="kvstore"),
        engine(tiny_model_dir, kv_transfer=config, prefix_caching_hash_algo="xxhash") as llm,
    ):
        registry = scheduler_connector(llm).runtime.registry
        stable = registry.get_sample_value("kvstore_keys_stable")
        hybrid_off = registry.get_sample_value("kvstore_hybrid_manager_off")
    assert stable == 0
    assert any("PYTHONHASHSEED" in r.getMessage() for r in caplog.records)
    assert hybrid_off == 0  # full attention only: nothing lost to the hybrid manager being off
    assert not any("sliding-window" in r.getMessage() for r in caplog.records)
