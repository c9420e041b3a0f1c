"""`kvstore demo`: the real vLLM engine with KVStoreConnector on a multi-turn workload.

Builds the tiny random Llama locally, replays multi-turn conversations whose history outgrows
the engine's KV cache (round-robin, so each conversation's prefix has left the engine when it
comes back), and reports what each kvstore tier served. Then it replays exactly the same
prompts, in the same batches, on an engine without kvstore and checks the run with the three
oracles of `kvstore.oracle`: every loaded chunk byte-identical to what the engine stored (the
load audit), the KV that loads put into the engine's cache equal, block by block, to what the
reference engine computed for the same tokens, and greedy outputs equal to the reference's
(at least 90% of the sequences to their end; the others may stop where its top two logits tie).

Where the workload's history outgrows the engine's own cache, loads are expected: a run that
then loaded nothing fails, instead of passing checks that had nothing to check.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvstore.demo.options import DemoOptions
from kvstore.demo.workload import DemoWorkload
from kvstore.hashing import chunk_keys
from kvstore.oracle import (
    AuditReport,
    GreedyRun,
    KVReport,
    OutputsReport,
    compare_greedy,
    compare_kv,
)
from kvstore.tiny_model import TinyLlamaSpec, build_tiny_llama
from kvstore.vllm.engine import (
    drain,
    engine,
    generate_runs,
    kv_transfer_config,
    scheduler_connector,
)
from kvstore.vllm.kv_probe import LoadCounts, LoadProbe, computed_kv, loaded_kv

__all__ = ["DemoOptions", "DemoResult", "TurnStats", "run_demo"]

logger = logging.getLogger(__name__)

_ENGINE_BLOCK_TOKENS = 32
_WARMUP_PROMPT = [7] * (_ENGINE_BLOCK_TOKENS // 2)  # shorter than a block: stores nothing


@dataclass(frozen=True, slots=True)
class TurnStats:
    """Prompt tokens of one turn, by who served them."""

    turn: int
    num_requests: int
    prompt_tokens: int
    engine_cache_tokens: int  # vLLM's own prefix cache
    cpu_tokens: int  # kvstore's CPU tier
    disk_tokens: int  # kvstore's disk tier

    @property
    def computed_tokens(self) -> int:
        served = self.engine_cache_tokens + self.cpu_tokens + self.disk_tokens
        return self.prompt_tokens - served


OnTurn = Callable[[TurnStats], None]
AfterTurn = Callable[[int, Any], None]  # (turn, llm): a test's fault injection point


@dataclass(slots=True)
class DemoResult:
    store_path: Path
    metrics_url: str | None
    turns: list[TurnStats] = field(default_factory=list)
    elapsed_s: float = 0.0
    baseline_elapsed_s: float | None = None
    baseline_prefill_tokens: int | None = None
    audit: AuditReport | None = None
    kv: KVReport | None = None
    outputs: OutputsReport | None = None
    loads: LoadCounts = field(default_factory=LoadCounts)
    expects_loads: bool = False  # the history outgrew the engine's own cache
    summary: dict[str, Any] = field(default_factory=dict)

    @property
    def num_requests(self) -> int:
        return sum(t.num_requests for t in self.turns)

    @property
    def prompt_tokens(self) -> int:
        return sum(t.prompt_tokens for t in self.turns)

    @property
    def kvstore_hit_tokens(self) -> int:
        return sum(t.cpu_tokens + t.disk_tokens for t in self.turns)

    @property
    def engine_hit_tokens(self) -> int:
        return sum(t.engine_cache_tokens for t in self.turns)

    @property
    def prefill_tokens(self) -> int:
        return sum(t.computed_tokens for t in self.turns)

    @property
    def is_correct(self) -> bool:
        """Every oracle passed; where loads were expected, they happened and were checked."""
        if self.audit is None:
            return False
        if self.loads.num_blocks == 0 and not self.audit.mismatched:
            return not self.expects_loads and (self.outputs is None or self.outputs.is_ok)
        return (
            self.audit.is_ok
            and (self.kv is None or self.kv.is_ok)
            and (self.outputs is None or self.outputs.is_ok)
        )


def run_demo(
    options: DemoOptions,
    on_progress: Callable[[str], None] = logger.info,
    on_turn: OnTurn | None = None,
    after_turn: AfterTurn | None = None,
) -> DemoResult:
    options.directory.mkdir(parents=True, exist_ok=True)
    model = build_tiny_llama(options.model_path)
    workload = DemoWorkload(
        num_conversations=options.num_conversations, num_turns=options.num_turns
    )
    result = DemoResult(store_path=options.store_path, metrics_url=None)
    on_progress("kvstore: the workload with KVStoreConnector (CPU region + LMDB store)")
    batches, runs, loaded = _run_with_kvstore(
        options, model, workload, result, on_progress, (on_turn, after_turn)
    )
    result.audit = AuditReport.from_counts(result.summary.get("load_audit", {}))
    result.loads = loaded.counts
    result.expects_loads = _expects_loads(batches, workload, options)
    if options.compare_baseline:
        on_progress("reference: the same prompts, in the same batches, without kvstore")
        wanted = frozenset(block.block_hash for block in loaded.blocks)
        with engine(model, **_engine_kwargs(options)) as llm:
            generate_runs(llm, [_WARMUP_PROMPT], max_tokens=1)
            start_s = time.perf_counter()
            with computed_kv(llm, wanted) as computed:
                reference, prefill = _replay_reference(llm, batches, workload.reply_tokens)
            result.baseline_elapsed_s = time.perf_counter() - start_s
        result.baseline_prefill_tokens = prefill
        result.kv = compare_kv(computed.blocks, loaded.blocks)
        result.outputs = compare_greedy(reference, runs)
    return result


def _expects_loads(
    batches: list[list[list[int]]], workload: DemoWorkload, options: DemoOptions
) -> bool:
    """Whether some turn resends more distinct history (full blocks, the shared system prompt
    once) than the engine's own cache holds: then part of it has left the engine, and kvstore,
    which stores every chunk, must load it."""
    for prompts in batches[1:]:
        histories = [prompt[: len(prompt) - workload.user_tokens] for prompt in prompts]
        blocks = set().union(*(chunk_keys(h, _ENGINE_BLOCK_TOKENS) for h in histories))
        if len(blocks) > options.engine_kv_blocks:
            return True
    return False


def _run_with_kvstore(
    options: DemoOptions,
    model: Path,
    workload: DemoWorkload,
    result: DemoResult,
    on_progress: Callable[[str], None],
    hooks: tuple[OnTurn | None, AfterTurn | None],
) -> tuple[list[list[list[int]]], list[GreedyRun], LoadProbe]:
    """Replay `workload` on an engine with kvstore; fill `result`'s kvstore figures; the
    probe holds the KV each load put into the engine's cache."""
    config = kv_transfer_config(
        cpu_bytes=options.cpu_chunks * _chunk_bytes(),
        disk_path=str(options.store_path),
        disk_bytes=options.disk_bytes,
        metrics_port=options.metrics_port,
        events_log=str(options.directory / "events.jsonl"),
        audit_loads=True,
    )
    with engine(model, kv_transfer=config, **_engine_kwargs(options)) as llm:
        generate_runs(llm, [_WARMUP_PROMPT], max_tokens=1)  # one-off costs of a first engine
        runtime = scheduler_connector(llm).runtime
        server = runtime.metrics_server if runtime is not None else None
        result.metrics_url = server.url if server is not None else None
        if result.metrics_url:
            on_progress(f"metrics: {result.metrics_url}")
        start_s = time.perf_counter()
        with loaded_kv(llm) as loaded:
            batches, runs = _replay_kvstore(llm, workload, result, *hooks)
            drain(llm)
        result.elapsed_s = time.perf_counter() - start_s
        result.summary = runtime.summary() if runtime is not None else {}
    return batches, runs, loaded


def _engine_kwargs(options: DemoOptions) -> dict[str, Any]:
    return {
        "kv_cache_bytes": options.engine_kv_blocks * _chunk_bytes(),
        "max_model_len": 1536,
        "block_size": _ENGINE_BLOCK_TOKENS,
    }


def _replay_kvstore(
    llm: Any,
    workload: DemoWorkload,
    result: DemoResult,
    on_turn: OnTurn | None,
    after_turn: AfterTurn | None,
) -> tuple[list[list[list[int]]], list[GreedyRun]]:
    """Run every turn; return the prompts of each turn (its batch) and all greedy runs."""
    conversations = workload.start()
    runtime = scheduler_connector(llm).runtime
    batches: list[list[list[int]]] = []
    runs: list[GreedyRun] = []
    for turn in range(workload.num_turns):
        prompts = workload.next_prompts(conversations, turn)
        before = _hit_tokens(runtime)
        outputs, turn_runs = generate_runs(llm, prompts, max_tokens=workload.reply_tokens)
        after = _hit_tokens(runtime)
        workload.record_replies(conversations, [list(r.token_ids) for r in turn_runs])
        batches.append(prompts)
        runs += turn_runs
        cpu, disk = after[0] - before[0], after[1] - before[1]
        cached = sum(o.num_cached_tokens or 0 for o in outputs)
        stats = TurnStats(
            turn=turn,
            num_requests=len(prompts),
            prompt_tokens=sum(len(p) for p in prompts),
            engine_cache_tokens=max(0, cached - cpu - disk),
            cpu_tokens=cpu,
            disk_tokens=disk,
        )
        result.turns.append(stats)
        if on_turn is not None:
            on_turn(stats)
        if after_turn is not None:
            after_turn(turn, llm)
    return batches, runs


def _replay_reference(
    llm: Any, batches: list[list[list[int]]], max_tokens: int
) -> tuple[list[GreedyRun], int]:
    runs: list[GreedyRun] = []
    prefill = 0
    for prompts in batches:
        outputs, turn_runs = generate_runs(llm, prompts, max_tokens=max_tokens)
        runs += turn_runs
        prefill += sum(len(o.prompt_token_ids) - (o.num_cached_tokens or 0) for o in outputs)
    return runs, prefill


def _hit_tokens(runtime: Any) -> tuple[int, int]:
    if runtime is None:
        return 0, 0
    tiers = runtime.summary()["tiers"]
    return int(tiers["cpu"]["hit_tokens"]), int(tiers["disk"]["hit_tokens"])


def _chunk_bytes() -> int:
    """Bytes of one engine block of the tiny model: every layer's K and V, bf16."""
    return TinyLlamaSpec().kv_bytes_per_token * _ENGINE_BLOCK_TOKENS
