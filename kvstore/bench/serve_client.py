"""The workload and arguments `kvstore bench serve` gives vLLM's own benchmark client
(`python -m kvstore.vllm.bench_client`, what `vllm bench serve` runs): the `prefix_repetition`
dataset, greedy, EOS ignored, results saved as JSON by vLLM itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

__all__ = ["Workload", "client_argv"]


@dataclass(frozen=True, slots=True)
class Workload:
    """vLLM's `prefix_repetition` dataset: `num_prefixes` random prefixes of `prefix_len`
    tokens, each followed by `num_prompts // num_prefixes` random suffixes of `suffix_len`,
    shuffled; `output_len` tokens out; at most `max_concurrency` requests in flight."""

    prefix_len: int
    suffix_len: int
    num_prefixes: int
    num_prompts: int
    output_len: int
    max_concurrency: int
    seed: int = 0

    @property
    def request_tokens(self) -> int:
        return self.prefix_len + self.suffix_len + self.output_len

    @property
    def unique_prompt_tokens(self) -> int:
        """Distinct prompt tokens: every prefix once, every suffix."""
        return self.num_prefixes * self.prefix_len + self.num_prompts * self.suffix_len


def client_argv(
    workload: Workload, base_url: str, model: Path, result_dir: Path, result_file: str
) -> list[str]:
    """The arguments of `vllm bench serve` for one target."""
    return [
        "--backend", "openai", "--base-url", base_url, "--endpoint", "/v1/completions",
        "--model", str(model), "--tokenizer", str(model),
        "--dataset-name", "prefix_repetition",
        "--prefix-repetition-prefix-len", str(workload.prefix_len),
        "--prefix-repetition-suffix-len", str(workload.suffix_len),
        "--prefix-repetition-num-prefixes", str(workload.num_prefixes),
        "--prefix-repetition-output-len", str(workload.output_len),
        "--num-prompts", str(workload.num_prompts), "--seed", str(workload.seed),
        "--max-concurrency", str(workload.max_concurrency), "--request-rate", "inf",
        "--temperature", "0", "--ignore-eos", "--disable-tqdm",
        "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,99",
        "--save-result", "--result-dir", str(result_dir), "--result-filename", result_file,
    ]  # fmt: skip
