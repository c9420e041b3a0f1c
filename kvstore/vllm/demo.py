"""`kvstore demo`: the real vLLM engine with KVStoreConnector on a multi-turn workload.

Builds the tiny random Llama locally, replays multi-turn conversations whose history outgrows
the engine's KV cache (round-robin, so each conversation's prefix has left the engine when it
comes back), and reports what each kvstore tier served. Optionally replays the same workload
without kvstore first, to show the outputs are identical.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvstore.demo import DemoWorkload
from kvstore.testing.connector import drain
from kvstore.tiny_model import TinyLlamaSpec, build_tiny_llama
from kvstore.vllm.engine import engine, generate_outputs, kv_transfer_config, scheduler_connector

__all__ = ["DemoOptions", "DemoResult", "run_demo"]

logger = logging.getLogger(__name__)

_ENGINE_BLOCK_TOKENS = 32


@dataclass(frozen=True, slots=True)
class DemoOptions:
    directory: Path = Path(".kvstore")
    num_conversations: int = 6
    num_turns: int = 6
    engine_kv_blocks: int = 64  # the engine's own KV cache: 2048 tokens, far less than the history
    cpu_chunks: int = 96  # kvstore's CPU tier: 3072 tokens, also less than the history
    disk_bytes: int = 256 << 20
    metrics_port: int | None = 0  # 0 = any free port
    compare_baseline: bool = True

    @property
    def store_path(self) -> Path:
        return self.directory / "store"

    @property
    def model_path(self) -> Path:
        return self.directory / "model"


@dataclass(slots=True)
class DemoResult:
    store_path: Path
    metrics_url: str | None
    num_requests: int = 0
    prompt_tokens: int = 0
    kvstore_hit_tokens: int = 0
    engine_hit_tokens: int = 0
    elapsed_s: float = 0.0
    baseline_elapsed_s: float | None = None
    prefill_tokens: int = 0  # prompt tokens the engine computed (not served by any cache)
    baseline_prefill_tokens: int | None = None
    outputs_match_baseline: bool | None = None
    summary: dict[str, Any] = field(default_factory=dict)


def _replay(
    llm: Any, workload: DemoWorkload, on_turn: Callable[[int], None]
) -> tuple[list[list[int]], list[Any]]:
    conversations = workload.start()
    replies: list[list[int]] = []
    outputs: list[Any] = []
    for turn in range(workload.num_turns):
        prompts = workload.next_prompts(conversations, turn)
        turn_outputs = generate_outputs(llm, prompts, max_tokens=workload.reply_tokens)
        turn_replies = [list(o.outputs[0].token_ids) for o in turn_outputs]
        workload.record_replies(conversations, turn_replies)
        replies += turn_replies
        outputs += turn_outputs
        on_turn(turn)
    return replies, outputs


def run_demo(options: DemoOptions, on_progress: Callable[[str], None] = logger.info) -> DemoResult:
    options.directory.mkdir(parents=True, exist_ok=True)
    model = build_tiny_llama(options.model_path)
    workload = DemoWorkload(
        num_conversations=options.num_conversations, num_turns=options.num_turns
    )
    chunk_bytes = _chunk_bytes()
    engine_kwargs: dict[str, Any] = {
        "kv_cache_bytes": options.engine_kv_blocks * chunk_bytes,
        "max_model_len": 1536,
        "block_size": _ENGINE_BLOCK_TOKENS,
    }
    baseline: list[list[int]] | None = None
    result = DemoResult(store_path=options.store_path, metrics_url=None)
    if options.compare_baseline:
        on_progress("baseline: the same workload without kvstore (a warm-up pass, then timed)")
        with engine(model, **engine_kwargs) as llm:
            _replay(llm, workload, lambda t: None)  # the process's first engine pays one-off costs
            llm.reset_prefix_cache()
            start_s = time.perf_counter()
            baseline, baseline_outputs = _replay(llm, workload, lambda t: None)
            result.baseline_elapsed_s = time.perf_counter() - start_s
        result.baseline_prefill_tokens = _prefill_tokens(baseline_outputs)
    config = kv_transfer_config(
        cpu_bytes=options.cpu_chunks * chunk_bytes,
        disk_path=str(options.store_path),
        disk_bytes=options.disk_bytes,
        metrics_port=options.metrics_port,
        events_log=str(options.directory / "events.jsonl"),
    )
    on_progress("kvstore: the workload with KVStoreConnector (CPU region + LMDB store)")
    with engine(model, kv_transfer=config, **engine_kwargs) as llm:
        start_s = time.perf_counter()
        runtime = scheduler_connector(llm).runtime
        server = runtime.metrics_server if runtime is not None else None
        result.metrics_url = server.url if server is not None else None
        if result.metrics_url:
            on_progress(f"metrics: {result.metrics_url}")
        replies, outputs = _replay(
            llm, workload, lambda t: on_progress(f"turn {t + 1}/{workload.num_turns} done")
        )
        drain(llm)
        result.elapsed_s = time.perf_counter() - start_s
        result.summary = runtime.summary() if runtime is not None else {}
    result.num_requests = len(outputs)
    result.prompt_tokens = sum(len(o.prompt_token_ids) for o in outputs)
    result.prefill_tokens = _prefill_tokens(outputs)
    tiers = result.summary.get("tiers", {})
    result.kvstore_hit_tokens = int(sum(t["hit_tokens"] for t in tiers.values()))
    total_cached = sum(o.num_cached_tokens or 0 for o in outputs)
    result.engine_hit_tokens = max(0, total_cached - result.kvstore_hit_tokens)
    if baseline is not None:
        result.outputs_match_baseline = replies == baseline
    return result


def _prefill_tokens(outputs: list[Any]) -> int:
    return sum(len(o.prompt_token_ids) - (o.num_cached_tokens or 0) for o in outputs)


def _chunk_bytes() -> int:
    """Bytes of one engine block of the tiny model: every layer's K and V, bf16."""
    return TinyLlamaSpec().kv_bytes_per_token * _ENGINE_BLOCK_TOKENS
