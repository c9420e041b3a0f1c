"""Time to first token of a long repeated prompt: recomputed vs. loaded from kvstore's tiers.

The real vLLM CPU engine on a small random Llama (8 layers, 16 KiB of KV per token). In the same
run, for the same prompt that has left the engine's KV cache:

- recompute: no connector, the engine prefills the whole prompt again;
- kvstore CPU: KVStoreConnector loads the prefix from the shared CPU region;
- kvstore disk: the CPU tier has since been filled by other prompts, so the prefix comes from
  LMDB (promotion to CPU, then the load);
- engine prefix cache: the prompt never left the engine (vLLM's own hit, the lower bound).

Reported as ratios to the recompute time (machines are shared and noisy: compare within a run).

    .venv/bin/python benchmarks/bench_connector.py [--tokens 2048] [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

from kvstore.testing.connector import drain, kvstore_summary
from kvstore.tiny_model import TinyLlamaSpec, build_tiny_llama
from kvstore.vllm.engine import engine, generate_greedy, kv_transfer_config

SPEC = TinyLlamaSpec(
    hidden_size=512,
    intermediate_size=1536,
    num_hidden_layers=8,
    num_attention_heads=8,
    num_key_value_heads=8,
    head_dim=64,
    max_position_embeddings=8192,
)
BLOCK_TOKENS = 32
KV_BYTES_PER_TOKEN = SPEC.kv_bytes_per_token


def _prompt(seed: int, n: int) -> list[int]:
    return [(7919 * i + 104729 * seed) % (SPEC.vocab_size - 3) + 3 for i in range(n)]


def _ttft_s(llm: Any, prompt: list[int]) -> float:
    start = time.perf_counter()
    generate_greedy(llm, [prompt], max_tokens=1)
    return time.perf_counter() - start


def _measure(model: Path, tokens: int, repeats: int, workdir: Path) -> dict[str, list[float]]:
    common = {"kv_cache_bytes": 2 * tokens * KV_BYTES_PER_TOKEN, "max_model_len": tokens + 64}
    times: dict[str, list[float]] = {
        "recompute": [],
        "kvstore_cpu": [],
        "kvstore_disk": [],
        "engine_cache": [],
    }
    prompt_bytes = tokens * KV_BYTES_PER_TOKEN
    config = kv_transfer_config(
        cpu_bytes=2 * prompt_bytes + (4 << 20),  # two prompts: two more push one to disk
        disk_path=str(workdir / "store"),
        disk_bytes=8 * prompt_bytes,
    )
    with engine(model, kv_transfer=config, **common) as llm:
        _ttft_s(llm, _prompt(99, tokens))
        for r in range(repeats):
            prompt = _prompt(100 + r, tokens)
            _ttft_s(llm, prompt)
            drain(llm)
            llm.reset_prefix_cache()
            times["kvstore_cpu"].append(_ttft_s(llm, prompt))
            drain(llm)
            for filler in (200, 300):  # fill the CPU tier: the prompt is now on disk only
                _ttft_s(llm, _prompt(filler + r, tokens))
                drain(llm)
            llm.reset_prefix_cache()
            times["kvstore_disk"].append(_ttft_s(llm, prompt))
            drain(llm)
        summary = kvstore_summary(llm)
    with engine(model, **common) as llm:
        _ttft_s(llm, _prompt(99, tokens))  # warm up
        for r in range(repeats):
            prompt = _prompt(r, tokens)
            _ttft_s(llm, prompt)
            times["engine_cache"].append(_ttft_s(llm, prompt))
            llm.reset_prefix_cache()
            times["recompute"].append(_ttft_s(llm, prompt))
    tiers = summary["tiers"]
    print(
        f"kvstore hits: cpu {tiers['cpu']['hit_tokens']:.0f} tokens, "
        f"disk {tiers['disk']['hit_tokens']:.0f} tokens"
    )
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=2048, help="prompt length in tokens")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="kvstore-bench-") as tmp:
        workdir = Path(tmp)
        model = build_tiny_llama(workdir / "model", SPEC)
        times = _measure(model, args.tokens, args.repeats, workdir)
    for name, values in times.items():
        print(name, " ".join(f"{v:.3f}" for v in values))
    base = statistics.median(times["recompute"])
    print(f"\nprompt {args.tokens} tokens, KV {args.tokens * KV_BYTES_PER_TOKEN / 2**20:.0f} MiB")
    print(f"{'path':<14}{'TTFT median s':>15}{'vs recompute':>15}")
    for name, values in times.items():
        median = statistics.median(values)
        print(f"{name:<14}{median:>15.3f}{median / base:>15.2f}")


if __name__ == "__main__":
    main()
