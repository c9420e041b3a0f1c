"""Hybrid models: what kvstore does with them today (issue 24 is to support vLLM's hybrid KV
cache manager; until then this is the contract).

- A sliding-window model (a tiny Gemma-3-style model: three 64-token sliding-window layers and
  one full) runs with vLLM's hybrid manager off, which vLLM decides because KVStoreConnector
  does not declare `SupportsHMA`: its sliding-window layers are allocated as full attention.
  kvstore says so once at start and exports `kvstore_hybrid_manager_off 1`, and its CPU and
  disk hits pass both oracles against a reference engine that allocates the same way.
- A model with Mamba / linear-attention state (a tiny Jamba config) needs the hybrid manager:
  it is refused while vLLM builds its config, with a message naming the model kind, before any
  weights load. The sliding-window model's config passes the same check.
"""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from kvstore.tiny_model import GEMMA3_SLIDING_WINDOW, build_tiny_gemma3
from kvstore.vllm.engine import engine, generate_runs, kv_transfer_config, scheduler_connector
from kvstore.vllm.geometry import local_attention
from kvstore.vllm.kv_probe import computed_kv, loaded_kv
from tests.support.connector import drain, kvstore_summary
from tests.support.oracle import assert_audited, assert_kv_equal, assert_same_outputs

CHUNK_BYTES = 4 * 2 * 2 * 32 * 4 * 32  # layers x (K, V) x KV heads x head dim x float32 x tokens
PROMPT_A = [(7 * i + 3) % 500 + 5 for i in range(200)]  # 6 full chunks before the last token
PROMPT_B = [(11 * i + 1) % 500 + 5 for i in range(200)]

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
    """Runs and KV of an engine without kvstore that allocates as kvstore's engine does (its
    hybrid manager off), so that the KV of each block compares."""
    with (
        engine(gemma_dir, disable_hybrid_kv_cache_manager=True) as llm,
        computed_kv(llm) as computed,
    ):
        _, cold = generate_runs(llm, [PROMPT_A, PROMPT_B])
        _, warm = generate_runs(llm, [PROMPT_A, PROMPT_B])
    return {"cold": cold, "warm": warm, "kv": computed.blocks}


@pytest.mark.engine
def test_a_sliding_window_model_serves_cpu_and_disk_hits_and_says_what_it_costs(
    gemma_dir: Path, baseline: dict[str, Any], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config = kv_transfer_config(
        cpu_bytes=8 * CHUNK_BYTES,  # PROMPT_B's 6 chunks push most of PROMPT_A's to disk only
        disk_path=str(tmp_path / "store"),
        disk_bytes=64 * CHUNK_BYTES,
        audit_loads=True,
    )
    with (
        caplog.at_level(logging.WARNING, logger="kvstore"),
        engine(gemma_dir, kv_transfer=config) as llm,
    ):
        assert llm.llm_engine.vllm_config.scheduler_config.disable_hybrid_kv_cache_manager
        _, first = generate_runs(llm, [PROMPT_A])
        drain(llm)
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
        summary = kvstore_summary(llm)
        registry = scheduler_connector(llm).runtime.metrics.registry
        is_off = registry.get_sample_value("kvstore_hybrid_manager_off")
    assert is_off == 1
    said = [r.getMessage() for r in caplog.records if "sliding-window" in r.getMessage()]
    assert len(said) == 1, said
    assert "3 of this model's 4 attention layers" in said[0]
    assert f"window {GEMMA3_SLIDING_WINDOW} tokens" in said[0]
    assert_same_outputs(baseline["cold"][:1], first)
    assert_same_outputs(baseline["warm"][:1], cpu_hit)
    assert_same_outputs(baseline["warm"][:1], disk_hit)
    assert_kv_equal(baseline["kv"], from_cpu, num_blocks=6)
    assert_kv_equal(baseline["kv"], from_disk, num_blocks=6)
    assert_audited(summary, verified=12)
    assert summary["tiers"]["disk"]["hit_tokens"] > 0, summary


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
