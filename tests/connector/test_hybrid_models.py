"""Hybrid models on the real engine (a tiny Gemma-3-style model: three 64-token
sliding-window layers and one full).

- With kvstore, vLLM keeps its hybrid KV cache manager on (KVStoreConnector declares
  `SupportsHMA`): the engine allocates as it does without kvstore (same concurrency), kvstore
  stores each KV cache group apart and only the sliding-window chunks a later hit can read, and
  its CPU, disk and after-restart hits pass both oracles against an engine without kvstore.
- A user who turns the hybrid manager off still gets exact hits; kvstore says once at start
  what that costs and exports `kvstore_hybrid_manager_off 1`.
- A model with Mamba / linear-attention state (a tiny Jamba config) is refused while vLLM
  builds its config, with a message naming the model kind, before any weights load. The
  sliding-window model's config passes the same check.
"""

from __future__ import annotations

import logging
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from kvstore.oracle import GreedyRun
from kvstore.tiny_model import GEMMA3_SLIDING_WINDOW, build_tiny_gemma3
from kvstore.vllm.engine import (
    engine,
    generate_runs,
    kv_transfer_config,
    reset_prefix_cache,
    scheduler_connector,
)
from kvstore.vllm.geometry import local_attention
from kvstore.vllm.kv_probe import LoadProbe, computed_kv, loaded_kv
from tests.cli.helpers import run_json
from tests.support.connector import drain, kvstore_summary
from tests.support.oracle import assert_audited, assert_kv_equal, assert_same_outputs
from tests.support.redis_servers import redis_server

LAYER_CHUNK_BYTES = 2 * 2 * 32 * 4 * 32  # (K, V) x KV heads x head dim x float32 x tokens
CHUNK_BYTES = 4 * LAYER_CHUNK_BYTES  # a chunk of all four layers
PROMPT_A = [(7 * i + 3) % 500 + 5 for i in range(200)]  # 6 full chunks before the last token
PROMPT_B = [(11 * i + 1) % 500 + 5 for i in range(200)]
PROMPT_D = PROMPT_A[:140] + [(13 * i + 2) % 500 + 5 for i in range(60)]  # shares 4 chunks
RETENTION_TOKENS = 128  # sliding-window chunks kept before every 4-chunk boundary too
LONG_PROMPT = [(3 * i + 7) % 500 + 5 for i in range(1000)]
TURN_TOKENS = [(17 * i + 4) % 500 + 5 for i in range(30)]  # the next turn's new message

_BUILD_CONFIG = """
import sys
from vllm.config import KVTransferConfig
from vllm.engine.arg_utils import EngineArgs
transfer = KVTransferConfig(
    kv_connector="KVStoreConnector", kv_connector_module_path="kvstore.vllm", kv_role="kv_both"
)
EngineArgs(
    model=sys.argv[1], skip_tokenizer_init=True, kv_transfer_config=transfer, enforce_eager=True
).create_engine_config()
print("config built")
"""


@pytest.fixture(scope="module")
def gemma_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_gemma3(tmp_path_factory.mktemp("gemma3"))


@pytest.fixture(scope="module")
def baseline(gemma_dir: Path) -> dict[str, Any]:
    """Runs and KV of an engine without kvstore, its hybrid manager on (vLLM's default)."""
    with engine(gemma_dir) as llm, computed_kv(llm) as computed:
        _, cold = generate_runs(llm, [PROMPT_A, PROMPT_B])
        _, warm = generate_runs(llm, [PROMPT_A, PROMPT_B, PROMPT_D])
        # a conversation: PROMPT_B answered at length, then the next turn
        answered, _ = generate_runs(llm, [PROMPT_B], max_tokens=100)
        turn = [*PROMPT_B, *answered[0].outputs[0].token_ids, *TURN_TOKENS]
        _, next_turn = generate_runs(llm, [turn])
    with engine(gemma_dir) as llm:
        usage = decode_usage(llm)
    return {"cold": cold, "warm": warm, "kv": computed.blocks, "decode_usage": usage,
            "turn": turn, "next_turn": next_turn}  # fmt: skip


@dataclass
class Hits:
    first: list[GreedyRun]
    stored_bytes: float  # engine -> CPU for PROMPT_A
    cpu: list[GreedyRun]
    from_cpu: LoadProbe
    disk: list[GreedyRun]
    from_disk: LoadProbe


def cpu_then_disk_hits(llm: Any) -> Hits:
    """PROMPT_A computed and stored, then served from the CPU tier, then, once PROMPT_B has
    pushed it out of the CPU tier, from disk (the engine's own cache reset before each hit)."""
    _, first = generate_runs(llm, [PROMPT_A])
    drain(llm)
    stored = kvstore_summary(llm)["bytes"]["engine_to_cpu"]
    assert llm.reset_prefix_cache()
    with loaded_kv(llm) as from_cpu:
        _, cpu_hit = generate_runs(llm, [PROMPT_A])
    drain(llm)
    generate_runs(llm, [PROMPT_B])
    drain(llm)
    assert llm.reset_prefix_cache()
    with loaded_kv(llm) as from_disk:
        _, disk_hit = generate_runs(llm, [PROMPT_A])
    drain(llm)
    return Hits(first, stored, cpu_hit, from_cpu, disk_hit, from_disk)


def decode_usage(llm: Any) -> float:
    """The share of the engine's KV cache a 1000-token request holds while it decodes (every
    engine here has the same KV cache bytes): sliding-window layers hold only their window
    when vLLM's hybrid manager is on, every token when it is off."""
    core = llm.llm_engine.engine_core.engine_core
    step = core.step_fn
    samples = []

    def sampled_step() -> Any:
        result = step()
        if core.scheduler.running:
            samples.append(float(core.scheduler.kv_cache_manager.usage))
        return result

    core.step_fn = sampled_step
    try:
        generate_runs(llm, [LONG_PROMPT], max_tokens=4)
    finally:
        core.step_fn = step
    return samples[-1]


@pytest.mark.engine
def test_a_sliding_window_model_keeps_the_hybrid_manager_and_serves_exact_hits(
    gemma_dir: Path, baseline: dict[str, Any], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config = kv_transfer_config(
        cpu_bytes=24 * LAYER_CHUNK_BYTES,  # PROMPT_B's entries push PROMPT_A's to disk only
        disk_path=str(tmp_path / "store"),
        disk_bytes=256 * LAYER_CHUNK_BYTES,
        hybrid_retention_tokens=RETENTION_TOKENS,
        audit_loads=True,
    )
    with (
        caplog.at_level(logging.WARNING, logger="kvstore"),
        engine(gemma_dir, kv_transfer=config) as llm,
    ):
        assert not llm.llm_engine.vllm_config.scheduler_config.disable_hybrid_kv_cache_manager
        hits = cpu_then_disk_hits(llm)
        assert llm.reset_prefix_cache()
        with loaded_kv(llm) as shared:
            _, shared_hit = generate_runs(llm, [PROMPT_D])
        drain(llm)
        summary = kvstore_summary(llm)
        # the answer's window is kept when the request ends: the next turn hits past it
        generate_runs(llm, [PROMPT_B], max_tokens=100)
        drain(llm)
        assert reset_prefix_cache(llm)
        with loaded_kv(llm) as turn:
            _, next_turn = generate_runs(llm, [baseline["turn"]])
        drain(llm)
        registry = scheduler_connector(llm).runtime.metrics.registry
        is_off = registry.get_sample_value("kvstore_hybrid_manager_off")
        usage = decode_usage(llm)
    # the engine allocates as it does without kvstore
    assert usage == pytest.approx(baseline["decode_usage"])
    assert is_off == 0
    assert not [r for r in caplog.records if "sliding-window" in r.getMessage()]
    # PROMPT_A's entries: 6 full-attention chunks, and per sliding-window group the chunks
    # before boundaries 4 (retention) and 6 (the prompt's end): 2-5; not the 24 layer-chunks
    # a store of whole chunks takes
    assert hits.stored_bytes == (6 + 3 * 4) * LAYER_CHUNK_BYTES
    warm = baseline["warm"]
    assert_same_outputs(baseline["cold"][:1], hits.first)
    assert_same_outputs(warm[:1], hits.cpu)
    assert_same_outputs(warm[:1], hits.disk)
    assert_same_outputs(warm[2:], shared_hit)
    # a hit at boundary 6 loads 6 full-attention blocks and 2 per sliding-window group
    assert_kv_equal(baseline["kv"], hits.from_cpu, num_blocks=6 + 3 * 2)
    assert_kv_equal(baseline["kv"], hits.from_disk, num_blocks=6 + 3 * 2)
    # PROMPT_D shares 4 chunks: its hit stops at the retained boundary 4
    assert_kv_equal(baseline["kv"], shared, num_blocks=4 + 3 * 2)
    assert shared.counts.num_failed_blocks == 0
    assert_audited(summary, verified=3 * (6 + 3 * 2) - 2)
    assert summary["tiers"]["disk"]["hit_tokens"] > 0, summary
    # 299 tokens computed (200 + 100 - 1): boundary 9, whose window (chunks 7-8) only the
    # request's end keeps (retained boundaries are 4 and 8: windows 2-3 and 6-7)
    assert_same_outputs(baseline["next_turn"], next_turn)
    assert_kv_equal(baseline["kv"], turn, num_blocks=9 + 3 * 2)

    with engine(gemma_dir, kv_transfer=config) as llm:  # a restart: the disk tier serves
        with loaded_kv(llm) as restarted:
            _, after_restart = generate_runs(llm, [PROMPT_A])
        drain(llm)
        disk_tokens = kvstore_summary(llm)["tiers"]["disk"]["hit_tokens"]
    assert_same_outputs(warm[:1], after_restart)
    assert_kv_equal(baseline["kv"], restarted, num_blocks=6 + 3 * 2)
    assert disk_tokens == 6 * 32
    # the CLI names each entry's group, and decodes a row as that group's layers
    listed = run_json("ls", tmp_path / "store", "--json")["chunks"]
    groups = [(row["group"]["index"], row["group"]["kind"]) for row in listed]
    assert sorted(set(groups)) == [(0, "sliding"), (1, "sliding"), (2, "sliding"), (3, "full")]
    sliding = next(row for row in listed if row["group"]["index"] == 1)
    assert sliding["group"]["window_tokens"] == GEMMA3_SLIDING_WINDOW
    shown = run_json("show", tmp_path / "store", sliding["key"], "--json")
    assert [layer["name"] for layer in shown["layers"]] == ["model.layers.1.self_attn.attn"]


@pytest.mark.engine
@pytest.mark.redis
def test_a_fresh_engine_gets_hybrid_hits_from_the_remote_tier(
    gemma_dir: Path, baseline: dict[str, Any]
) -> None:
    """What one replica stores, another serves: the whole prompt again (the windows at its
    end), and a prompt sharing a prefix up to the retained boundary inside it."""
    with redis_server() as server:
        config = kv_transfer_config(
            cpu_bytes=64 * LAYER_CHUNK_BYTES,
            remote_url=server.url,
            hybrid_retention_tokens=RETENTION_TOKENS,
        )
        with engine(gemma_dir, kv_transfer=config) as llm:
            generate_runs(llm, [PROMPT_A])
            drain(llm)
            stored = kvstore_summary(llm)["tiers"]["remote"]["stored_chunks"]
        with engine(gemma_dir, kv_transfer=config) as llm:
            with loaded_kv(llm) as from_remote:
                _, remote_hit = generate_runs(llm, [PROMPT_A])
            drain(llm)
            assert reset_prefix_cache(llm)
            with loaded_kv(llm) as shared:
                _, shared_hit = generate_runs(llm, [PROMPT_D])
            drain(llm)
            summary = kvstore_summary(llm)
    assert stored == 6 + 3 * 4
    warm = baseline["warm"]
    assert_same_outputs(warm[:1], remote_hit)
    assert_kv_equal(baseline["kv"], from_remote, num_blocks=6 + 3 * 2)
    assert_same_outputs(warm[2:], shared_hit)
    assert_kv_equal(baseline["kv"], shared, num_blocks=4 + 3 * 2)
    # PROMPT_A's 6 chunks, then PROMPT_D's chunks 2-3 (0-1 were fetched for PROMPT_A)
    assert summary["tiers"]["remote"]["hit_tokens"] == (6 + 2) * 32, summary
    assert summary["tiers"]["cpu"]["hit_tokens"] == 2 * 32, summary


@pytest.mark.engine
def test_with_the_hybrid_manager_turned_off_hits_stay_exact_and_kvstore_says_what_it_costs(
    gemma_dir: Path, baseline: dict[str, Any], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config = kv_transfer_config(
        cpu_bytes=8 * CHUNK_BYTES,  # PROMPT_B's 6 chunks push most of PROMPT_A's to disk only
        disk_path=str(tmp_path / "store"),
        disk_bytes=64 * CHUNK_BYTES,
        audit_loads=True,
    )
    # the reference allocates as kvstore's engine does here, so the KV of each block compares
    with (
        engine(gemma_dir, disable_hybrid_kv_cache_manager=True) as llm,
        computed_kv(llm) as computed,
    ):
        _, cold = generate_runs(llm, [PROMPT_A])
        _, warm = generate_runs(llm, [PROMPT_A])
    with (
        caplog.at_level(logging.WARNING, logger="kvstore"),
        engine(gemma_dir, kv_transfer=config, disable_hybrid_kv_cache_manager=True) as llm,
    ):
        hits = cpu_then_disk_hits(llm)
        summary = kvstore_summary(llm)
        registry = scheduler_connector(llm).runtime.metrics.registry
        is_off = registry.get_sample_value("kvstore_hybrid_manager_off")
        usage_off = decode_usage(llm)
    assert is_off == 1
    said = [r.getMessage() for r in caplog.records if "sliding-window" in r.getMessage()]
    assert len(said) == 1, said
    assert "3 of this model's 4 attention layers" in said[0]
    assert f"window {GEMMA3_SLIDING_WINDOW} tokens" in said[0]
    assert_same_outputs(cold, hits.first)
    assert_same_outputs(warm, hits.cpu)
    assert_same_outputs(warm, hits.disk)
    assert_kv_equal(computed.blocks, hits.from_cpu, num_blocks=6)
    assert_kv_equal(computed.blocks, hits.from_disk, num_blocks=6)
    assert_audited(summary, verified=12)
    assert summary["tiers"]["disk"]["hit_tokens"] > 0, summary
    # what the hybrid manager saves: a long request holds ~3x the KV cache without it
    assert usage_off > 2.5 * baseline["decode_usage"], (usage_off, baseline["decode_usage"])


@pytest.mark.engine
def test_a_mamba_hybrid_is_refused_while_vllm_builds_its_config(
    tmp_path: Path, gemma_dir: Path
) -> None:
    from transformers import JambaConfig

    jamba = tmp_path / "jamba"
    JambaConfig(
        vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, attn_layer_period=2, attn_layer_offset=1,
        expert_layer_period=2, expert_layer_offset=1, num_experts=1, mamba_d_state=8,
        mamba_dt_rank=8, architectures=["JambaForCausalLM"],
    ).save_pretrained(jamba)  # fmt: skip
    refused = _build_config(jamba)
    assert refused.returncode != 0
    assert f"KVStoreConnector cannot serve {jamba}: it is a hybrid model" in refused.stderr
    assert "Mamba / linear-attention state" in refused.stderr
    assert "stores attention KV only" in refused.stderr
    built = _build_config(gemma_dir)
    assert built.returncode == 0, built.stderr[-2000:]
    assert "config built" in built.stdout


def _build_config(model: Path) -> subprocess.CompletedProcess[str]:
    """vLLM builds its config in a fresh process (the check runs as vLLM imports kvstore)."""
    return subprocess.run(
        [sys.executable, "-c", _BUILD_CONFIG, str(model)],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip


def test_local_attention_reads_the_window_vllm_keeps_on_promoted_specs() -> None:
    import torch
    from vllm.v1.kv_cache_interface import FullAttentionSpec, UniformTypeKVCacheSpecs

    def spec(**window: int) -> FullAttentionSpec:
        return FullAttentionSpec(
            block_size=32, num_kv_heads=2, head_size=32, dtype=torch.float32, **window
        )

    assert local_attention(spec()) == {"num_local_layers": 0, "local_window_tokens": 0}
    assert local_attention(spec(sliding_window=64)) == {
        "num_local_layers": 1,
        "local_window_tokens": 64,
    }
    uniform = UniformTypeKVCacheSpecs(
        block_size=32,
        kv_cache_specs={
            "a": spec(sliding_window=64),
            "b": spec(attention_chunk_size=128),
            "c": spec(),
        },
    )
    assert local_attention(uniform) == {"num_local_layers": 2, "local_window_tokens": 128}
    # vLLM merges a group's layers into one spec: the count comes from the model's layer types
    types = ["sliding_attention"] * 5 + ["full_attention"]
    assert local_attention(spec(sliding_window=64), types)["num_local_layers"] == 5
    assert local_attention(spec(), types)["num_local_layers"] == 0
