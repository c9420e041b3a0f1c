"""Hybrid models: the bytes kvstore stores per prompt and the time of its hit, with vLLM's
hybrid KV cache manager on (kvstore declares `SupportsHMA`) and off.

    kvstore bench hybrid [--tokens 2048] [--repeats 3] [--window 512] [--json F]

A Gemma-3-style random model (five sliding-window layers of `--window` tokens, then one full
attention layer, as Gemma 3 interleaves them; the widths and bf16 of the connector bench's
model) on the real vLLM CPU engine, in this process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`, the
layout of vLLM's uniproc executor), `VLLM_CPU_NUM_OF_RESERVED_CPU=1` for every engine unless
set. For each manager setting, one engine after the other:

- recompute: an engine without kvstore prefills a new prompt;
- floor: the same prompt again, from that engine's own prefix cache;
- stored per prompt: kvstore's engine -> CPU bytes for one prompt (manager on: every chunk of
  the full-attention layer, and of each sliding-window layer the chunks its window reaches
  back to from the prompt's end; off: every chunk of every layer);
- kvstore_cpu: after the engine's prefix cache is reset, kvstore loads the prompt's prefix
  from its CPU tier (checked: every full chunk before the last token, from the CPU tier).
Medians of `--repeats` prompts; ratios within the run (machines are noisy).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from kvstore.bench.engines import BENCH_SPEC, synthetic_prompt
from kvstore.tiny_model import build_tiny_gemma3

__all__ = ["HybridResult", "main", "measure"]

_CHUNK_TOKENS = 32  # the engine's block size, and kvstore's chunk
_NUM_SLIDING = 5


@dataclass
class HybridResult:
    """One manager setting: seconds per path, and kvstore's bytes stored per prompt."""

    manager: str  # "on" | "off"
    times: dict[str, list[float]] = field(default_factory=dict)
    stored_bytes: list[int] = field(default_factory=list)

    def median(self, path: str) -> float:
        return statistics.median(self.times[path])


def _kv_bytes_per_token() -> int:
    layers = _NUM_SLIDING + 1
    return layers * 2 * BENCH_SPEC.num_key_value_heads * BENCH_SPEC.head_dim * 2  # bf16


@contextmanager
def _engine(model: Path, num_tokens: int, is_hma_off: bool, kvstore: dict[str, Any] | None
            ) -> Iterator[Any]:  # fmt: skip
    from kvstore.vllm.engine import engine, kv_transfer_config

    with engine(
        model,
        kv_transfer=None if kvstore is None else kv_transfer_config(**kvstore),
        kv_cache_bytes=4 * num_tokens * _kv_bytes_per_token(),
        max_model_len=num_tokens + 64,
        block_size=_CHUNK_TOKENS,
        dtype=BENCH_SPEC.dtype,
        disable_hybrid_kv_cache_manager=is_hma_off,
    ) as llm:
        yield llm


def _ttft_s(llm: Any, prompt: list[int]) -> float:
    from kvstore.vllm.engine import generate_greedy

    start = time.perf_counter()
    generate_greedy(llm, [prompt], max_tokens=1)
    return time.perf_counter() - start


def reset_prefix_cache(llm: Any) -> bool:
    from kvstore.vllm.engine import reset_prefix_cache

    return reset_prefix_cache(llm)


def _summary(llm: Any) -> dict[str, Any]:
    from kvstore.vllm.engine import drain, scheduler_connector

    drain(llm)
    runtime = scheduler_connector(llm).runtime
    assert runtime is not None
    summary: dict[str, Any] = runtime.summary()
    return summary


def measure(
    model: Path, workdir: Path, num_tokens: int, repeats: int, *, is_hma_off: bool
) -> HybridResult:
    result = HybridResult("off" if is_hma_off else "on")
    times: dict[str, list[float]] = {"recompute": [], "floor": [], "kvstore_cpu": []}
    result.times = times
    prompts = [synthetic_prompt(100 + r, num_tokens) for r in range(repeats)]
    with _engine(model, num_tokens, is_hma_off, None) as llm:
        _ttft_s(llm, synthetic_prompt(1, num_tokens))  # one-off costs of a new engine
        for prompt in prompts:
            times["recompute"].append(_ttft_s(llm, prompt))
            times["floor"].append(_ttft_s(llm, prompt))
    hit = (num_tokens - 1) // _CHUNK_TOKENS * _CHUNK_TOKENS
    config = {"cpu_bytes": 4 * repeats * num_tokens * _kv_bytes_per_token(),
              "region_dir": str(workdir)}  # fmt: skip
    with _engine(model, num_tokens, is_hma_off, config) as llm:
        _ttft_s(llm, synthetic_prompt(2, num_tokens))
        for prompt in prompts:
            before = _summary(llm)
            _ttft_s(llm, prompt)  # computed and stored
            after = _summary(llm)
            result.stored_bytes.append(
                int(after["bytes"]["engine_to_cpu"] - before["bytes"]["engine_to_cpu"])
            )
            if not reset_prefix_cache(llm):
                raise RuntimeError("vLLM refused to reset its prefix cache")
            times["kvstore_cpu"].append(_ttft_s(llm, prompt))
            served = _summary(llm)["tiers"]["cpu"]["hit_tokens"] - after["tiers"]["cpu"][
                "hit_tokens"
            ]
            if served != hit:
                raise RuntimeError(f"the timed hit served {served} tokens from CPU, not {hit}")
    return result


def report(results: Sequence[HybridResult], num_tokens: int, window: int) -> str:
    by = {r.manager: r for r in results}
    off_bytes = statistics.median(by["off"].stored_bytes) if "off" in by else None
    lines = [
        f"Gemma-3-style model: {_NUM_SLIDING} sliding-window layers of {window} tokens + 1 full, "
        f"prompt {num_tokens} tokens, {_CHUNK_TOKENS}-token chunks, in-process engine, "
        f"{os.cpu_count()} cores, VLLM_CPU_NUM_OF_RESERVED_CPU="
        f"{os.environ.get('VLLM_CPU_NUM_OF_RESERVED_CPU')} for every engine",
        "",
        "| hybrid manager | stored per prompt | vs manager off | recompute s | floor s "
        "| kvstore CPU hit s | hit vs floor | hit vs recompute |",
        "|---|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for result in results:
        stored = statistics.median(result.stored_bytes)
        ratio = f"{stored / off_bytes:.2f}" if off_bytes else "-"
        recompute, floor = result.median("recompute"), result.median("floor")
        hit = result.median("kvstore_cpu")
        lines.append(
            f"| {result.manager} | {stored / 2**20:.2f} MiB | {ratio} | {recompute:.3f} "
            f"| {floor:.3f} | {hit:.3f} | {hit / floor:.2f} | {hit / recompute:.2f} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="kvstore bench hybrid",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--tokens", type=int, default=2048, help="prompt length")
    parser.add_argument("--repeats", type=int, default=3, help="prompts per path")
    parser.add_argument("--window", type=int, default=512, help="sliding window, tokens")
    parser.add_argument("--json", type=Path, help="write the raw results here")
    args = parser.parse_args(argv)
    if args.tokens <= args.window + _CHUNK_TOKENS:
        parser.error("--tokens must exceed --window by more than a chunk")
    os.environ.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "1")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    with tempfile.TemporaryDirectory(prefix="kvstore-bench-hybrid-") as tmp:
        workdir = Path(tmp)
        model = build_tiny_gemma3(
            workdir / "model", spec=BENCH_SPEC, num_sliding=_NUM_SLIDING, window=args.window
        )
        results = [
            measure(model, workdir, args.tokens, args.repeats, is_hma_off=is_off)
            for is_off in (False, True)
        ]
    text = report(results, args.tokens, args.window)
    print(text)
    if args.json is not None:
        args.json.write_text(json.dumps([asdict(r) for r in results], indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
