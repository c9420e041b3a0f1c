"""The benchmarks' in-process layout: an engine hosted in a process of its own
(`kvstore.bench.hosted`), with vLLM's multiprocessing off inside it, driven from the test."""

from __future__ import annotations

import os
from pathlib import Path

import psutil
import pytest

from kvstore.bench.engines import bench_engine, synthetic_prompt

TOKENS = 256


def test_a_hosted_engine_runs_in_process_and_serves_a_cpu_hit(tiny_model_dir: Path) -> None:
    """The host's engine runs in-process (no EngineCore child), serves a CPU-tier hit after
    vLLM's own cache was reset (which needs the host to take the steps that free the stored
    request's blocks), and the caller's process setting does not change."""
    before = os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING")
    prompt = synthetic_prompt(5, TOKENS)
    with bench_engine(tiny_model_dir, TOKENS, kvstore={"cpu_bytes": 64 << 20}, hosted=True) as e:
        assert e.metrics_url is not None
        assert e.ttft_s(prompt) > 0  # computed, and stored in the CPU tier
        e.reset_prefix_cache()
        with e.expect_hits("cpu", (TOKENS - 1) // 32 * 32, is_sole_tier=True):
            e.ttft_s(prompt)
        host = psutil.Process(e.runner.pid)  # type: ignore[attr-defined]
        commands = [" ".join(child.cmdline()) for child in host.children(recursive=True)]
        assert not any("EngineCore" in command for command in commands), commands
        with pytest.raises(RuntimeError, match="host process"):
            _ = e.llm  # the vllm.LLM lives in the host, not here
    assert os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING") == before
