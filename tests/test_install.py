"""The install is real: the vLLM CPU engine runs the tiny local Llama and decodes greedily."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvstore.vllm.engine import engine, generate_greedy

pytestmark = pytest.mark.engine


def test_tiny_llama_generates_greedily(tiny_model_dir: Path) -> None:
    prompt = list(range(3, 70))
    with engine(tiny_model_dir) as llm:
        first = generate_greedy(llm, [prompt], max_tokens=6)
        second = generate_greedy(llm, [prompt], max_tokens=6)
    assert len(first[0]) == 6
    assert all(0 <= t < 512 for t in first[0])
    assert first == second  # greedy is deterministic, prefix-cache hit or not


def test_torch_is_the_cpu_build() -> None:
    import torch
    import vllm

    assert vllm.__version__.startswith("0.32.0")
    assert torch.__version__.startswith("2.13.0")
