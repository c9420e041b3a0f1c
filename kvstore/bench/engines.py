"""Engines for the benchmarks: real vLLM CPU engines, each measured alone.

A `BenchEngine` is a `vllm.LLM` in vLLM's default multiprocessing mode (its EngineCore, and with
it kvstore's scheduler and worker halves, runs in a child process), or in the in-process layout
(`VLLM_ENABLE_V1_MULTIPROCESSING=0`) hosted in a process of its own (`kvstore.bench.hosted`), so
that two engines, one with kvstore and one without, stay up side by side and the benchmark can
interleave their measurements. What kvstore did is read from its metrics endpoint, as an
operator would.

The engine "without kvstore" has no KV connector, or `NullConnector` (a connector that moves
nothing). vLLM's CPU platform gives an engine with any KV connector a different core layout (on
2 cores, an OpenMP team on both instead of one core; see `kvstore/vllm/null_connector.py`), which
alone halves a prefill's time there: the benchmarks set `VLLM_CPU_NUM_OF_RESERVED_CPU` for every
engine, so all get the same layout, and say so in their reports.
"""

from __future__ import annotations

import contextlib
import os
import random
import time
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from prometheus_client.parser import text_string_to_metric_families

from kvstore.ports import free_port
from kvstore.tiny_model import TinyLlamaSpec
from kvstore.vllm.engine import engine, generate_greedy, kv_transfer_config
from kvstore.vllm.null_connector import null_transfer_config

__all__ = [
    "BENCH_SPEC",
    "BenchEngine",
    "bench_engine",
    "free_port",
    "scrape_metrics",
    "synthetic_prompt",
]

BENCH_SPEC = TinyLlamaSpec(
    hidden_size=512,
    intermediate_size=1536,
    num_hidden_layers=8,
    num_attention_heads=8,
    num_key_value_heads=8,
    head_dim=64,
    max_position_embeddings=16384,
    dtype="bfloat16",
)
"""An 8-layer random Llama with 16 KiB of KV per token: prefill is real work on a CPU."""

SETTLE_S = 0.3
"""Pause between two measurements: lets the previous engine's OpenMP threads stop spinning."""


def synthetic_prompt(seed: int, num_tokens: int) -> list[int]:
    """A deterministic prompt; different seeds share no prefix (tokens drawn from a generator
    seeded with `seed`: an arithmetic sequence with a seed-dependent offset repeated itself,
    seeds 2 and 1020 gave the same prompt, so a filler hit the warm-up's chunks)."""
    rng = random.Random(seed)
    return [rng.randrange(3, BENCH_SPEC.vocab_size) for _ in range(num_tokens)]


class Generator(Protocol):
    """What a benchmark does with an engine: an engine here (`LocalLLM`) or in a host process
    of its own (`kvstore.bench.hosted.HostedLLM`)."""

    def generate_s(self, prompts: Sequence[Sequence[int]], max_tokens: int) -> float: ...

    def reset_prefix_cache(self) -> bool: ...


@dataclass
class LocalLLM:
    """A `vllm.LLM` of this process."""

    llm: Any

    def generate_s(self, prompts: Sequence[Sequence[int]], max_tokens: int) -> float:
        start = time.perf_counter()
        generate_greedy(self.llm, prompts, max_tokens=max_tokens)
        return time.perf_counter() - start

    def reset_prefix_cache(self) -> bool:
        return bool(self.llm.reset_prefix_cache())


def scrape_metrics(
    url: str, timeout_s: float = 10.0
) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """A Prometheus endpoint's samples: (sample name, sorted labels) -> value."""
    with urllib.request.urlopen(url, timeout=timeout_s) as response:
        text = response.read().decode()
    samples: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


@dataclass
class BenchEngine:
    """A running engine; `metrics_url` is set when kvstore is on."""

    runner: Generator
    metrics_url: str | None = None

    @property
    def llm(self) -> Any:
        """The `vllm.LLM`, for an engine of this process."""
        if not isinstance(self.runner, LocalLLM):
            raise RuntimeError("this engine runs in a host process")
        return self.runner.llm

    def ttft_s(self, prompt: Sequence[int]) -> float:
        """Seconds until the first generated token of `prompt` (a one-token generate)."""
        time.sleep(SETTLE_S)
        return self.runner.generate_s([prompt], 1)

    def batch_s(self, prompts: Sequence[Sequence[int]], max_tokens: int) -> float:
        time.sleep(SETTLE_S)
        return self.runner.generate_s(prompts, max_tokens)

    def reset_prefix_cache(self) -> None:
        if not self.runner.reset_prefix_cache():
            raise RuntimeError("vLLM refused to reset its prefix cache (requests in flight?)")

    def metrics(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        """kvstore's metrics: (sample name, sorted labels) -> value."""
        if self.metrics_url is None:
            raise RuntimeError("this engine runs without kvstore")
        return scrape_metrics(self.metrics_url)

    def metric(self, name: str, **labels: str) -> float:
        return self.metrics().get((name, tuple(sorted(labels.items()))), 0.0)

    def hit_tokens(self) -> tuple[float, float]:
        """kvstore's hit tokens so far: (CPU tier, disk tier)."""
        by_tier = self.hit_tokens_by_tier()
        return by_tier.get("cpu", 0.0), by_tier.get("disk", 0.0)

    @contextlib.contextmanager
    def expect_hits(
        self, tier: str, at_least: int, *, is_sole_tier: bool = False
    ) -> Iterator[None]:
        """Raise unless kvstore reported at least `at_least` hit tokens from `tier` during the
        block (a benchmark that timed a miss would report a wrong number); `is_sole_tier`: and
        none from any other tier (a row named for one tier must not time another's hits)."""
        before = self.hit_tokens_by_tier()
        yield
        after = self.hit_tokens_by_tier()
        got = {name: after[name] - before.get(name, 0.0) for name in after}
        if got.get(tier, 0.0) < at_least:
            raise RuntimeError(f"expected a {tier} hit of >= {at_least} tokens, got {got}")
        others = {name: n for name, n in got.items() if name != tier and n}
        if is_sole_tier and others:
            raise RuntimeError(f"expected hits from {tier} only, got {got}")

    def hit_tokens_by_tier(self) -> dict[str, float]:
        """kvstore's hit tokens so far, per tier."""
        return {
            dict(labels)["tier"]: value
            for (name, labels), value in self.metrics().items()
            if name == "kvstore_hit_tokens_total"
        }

    def wait_settled(self, timeout_s: float = 120.0) -> None:
        """Wait until kvstore's write-through queue is empty and the disk tier stops growing."""
        deadline = time.monotonic() + timeout_s
        last = -1.0
        while time.monotonic() < deadline:
            depth = self.metric("kvstore_queue_depth", queue="write_through")
            stored = self.metric("kvstore_stored_chunks_total", tier="disk")
            if depth == 0 and stored == last:
                return
            last = stored
            time.sleep(0.2)
        raise TimeoutError(f"kvstore's disk writes did not settle in {timeout_s} s")


@contextlib.contextmanager
def bench_engine(
    model: Path,
    num_tokens: int,
    *,
    kv_cache_tokens: int | None = None,
    kvstore: Mapping[str, Any] | None = None,
    multiprocess: bool = True,
    has_connector: bool = True,
    hosted: bool = False,
) -> Iterator[BenchEngine]:
    """An engine for prompts of up to `num_tokens` whose own KV cache holds `kv_cache_tokens`
    (two such prompts by default); kvstore on when `kvstore` (its `kv_connector_extra_config`)
    is given, else `NullConnector`, or no connector at all when not `has_connector`.
    `multiprocess`: vLLM's default layout (the engine core in a child process), else the
    engine in this process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`), or with `hosted` in a process
    of its own in that layout (`kvstore.bench.hosted`: one engine per process, measured alone)."""
    if hosted:
        from kvstore.bench.hosted import HostedLLM

        spec = {"model": str(model), "num_tokens": num_tokens, "kv_cache_tokens": kv_cache_tokens,
                "kvstore": dict(kvstore) if kvstore is not None else None,
                "has_connector": has_connector}  # fmt: skip
        host = HostedLLM(spec)
        try:
            yield BenchEngine(host, host.metrics_url)
        finally:
            host.close()
        return
    kv_bytes = (kv_cache_tokens or 2 * num_tokens) * BENCH_SPEC.kv_bytes_per_token
    metrics_url = None
    transfer: dict[str, Any] | None = null_transfer_config() if has_connector else None
    if kvstore is not None:
        port = free_port()
        transfer = kv_transfer_config(metrics_port=port, **kvstore)
        metrics_url = f"http://127.0.0.1:{port}/metrics"
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    with engine(
        model,
        kv_transfer=transfer,
        kv_cache_bytes=kv_bytes,
        max_model_len=num_tokens + 64,
        dtype=BENCH_SPEC.dtype,
        multiprocess=multiprocess,
    ) as llm:
        yield BenchEngine(LocalLLM(llm), metrics_url)
