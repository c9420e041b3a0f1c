"""Scenario 6, soak (bounded): random prompts with shared prefixes through the OpenAI server with
kvstore for a fixed time, while RSS, open descriptors and kvstore's own gauges are sampled.

Then the same server without kvstore takes the same load for a shorter time, because vLLM's CPU
worker grows by itself (~2 MB per 1000 requests on this machine, with or without kvstore): what
kvstore adds is the difference. (Side by side on two cores the two engines starve each other.) For
each process of the engine (the API server, the EngineCore with kvstore's scheduler half, the
worker with its worker half) the least-squares slope of RSS after a warm-up is turned into MB
per 1000 requests; kvstore's server may grow at most a fixed margin faster than the baseline.
Open descriptors must not grow, kvstore's queues must be empty once the load stops, every
completion must match the engine without kvstore (tie-aware: the server cannot return logprobs
without a tokenizer, so the reference's top-2 gaps decide), and the load audit must find no
loaded chunk that differs. Queue drops are counted, not failed. What the pipeline holds (CPU
and disk pins, holds, promotions, worker jobs, tracked requests: `kvstore_pipeline_inflight`) is
sampled with the other gauges and must be back to 0 once the load stops.
"""

from __future__ import annotations

import math
import random
import time
from typing import Any

from reliability.engines import CHUNK_BYTES, EngineHost, TokenOracle
from reliability.engines import shared_prefix_prompts as prompts_of
from reliability.registry import Outcome, RunContext, scenario
from reliability.soak import OpenAIServer, Target, growth_per_1k
from tests.support.net import free_port

__all__ = ["soak"]

_MAX_TOKENS = 8
_NUM_CLIENTS = 2  # per server
_MARGIN_MB_PER_1K = 1.0
_FD_GROWTH_LIMIT = 2
_ENGINE_ROLES = ("engine core", "worker")


def _extra(ctx: RunContext, metrics_port: int) -> dict[str, Any]:
    return {
        "cpu_bytes": 64 * CHUNK_BYTES,
        "disk_path": str(ctx.workdir / "store"),
        "disk_bytes": 2048 * CHUNK_BYTES,
        "region_dir": str(ctx.workdir / "shm"),
        "metrics_port": metrics_port,
        "audit_loads": True,
    }


@scenario(
    "soak",
    number=6,
    title="soak (bounded)",
    pass_rule=f"the OpenAI server with kvstore under {_NUM_CLIENTS} clients of random "
    "shared-prefix prompts, then the same server without kvstore: after warm-up the RSS of "
    f"kvstore's EngineCore and worker grows <= {_MARGIN_MB_PER_1K:g} MB per 1000 requests "
    "faster than the baseline's (least squares; judged in the full run, the 30-second smoke "
    f"only reports slopes), open descriptors by <= {_FD_GROWTH_LIMIT}; kvstore's queues empty "
    "and nothing pinned, held or in flight after the load; every request answered; 0 load-audit "
    "mismatches; 0 sequences diverge",
    timeout_s=1200,
    smoke_timeout_s=180,
    needs=("engine",),
)
def soak(ctx: RunContext) -> Outcome:
    duration_s = ctx.trials(smoke=30, full=600)
    baseline_s = ctx.trials(smoke=0, full=210)
    warmup_s = ctx.trials(smoke=10, full=90)
    rng = random.Random(ctx.seed + 6)
    pool = prompts_of(rng, num_families=8, per_family=12, prefix_tokens=(96, 320))
    metrics_port = free_port()
    host = EngineHost(ctx.workdir / "reference.log", name="soak reference")
    targets: list[Target] = []
    try:
        model = str(host.call({"op": "model", "dir": str(ctx.workdir / "model")})["dir"])
        log = ctx.workdir / "server-kvstore.log"
        server = OpenAIServer(model, free_port(), _extra(ctx, metrics_port), log)
        targets.append(Target("kvstore", server))
        oracle = TokenOracle.from_engine(host, model, pool, _MAX_TOKENS)
        host.close()
        final = _run_load(targets[0], pool, metrics_port, duration_s, ctx.seed)
        targets[0].exit_code = server.stop()
        if baseline_s:
            log = ctx.workdir / "server-baseline.log"
            targets.append(Target("baseline", OpenAIServer(model, free_port(), None, log)))
            _run_load(targets[1], pool, None, baseline_s, ctx.seed)
    finally:
        host.close()
        for target in targets:
            target.exit_code = target.server.stop()
    return _outcome(ctx, oracle, targets, final, warmup_s)


def _run_load(
    target: Target, pool: list[list[int]], metrics_port: int | None, duration_s: float, seed: int
) -> dict[str, float]:
    """Load `target` for `duration_s`, sampling it; kvstore's metrics at the end (or {})."""
    target.server.wait_healthy(300)
    target.start_clients(pool, _NUM_CLIENTS, seed, _MAX_TOKENS)
    start = time.monotonic()
    interval_s = max(2.0, duration_s / 120)
    while (now := time.monotonic() - start) < duration_s:
        target.sample(now, metrics_port)
        time.sleep(interval_s)
    target.stop_clients()
    if metrics_port is None:
        return {}
    time.sleep(2.0)  # the last write-through settles
    return target.scrape_final(metrics_port)


def _outcome(
    ctx: RunContext,
    oracle: TokenOracle,
    targets: list[Target],
    final: dict[str, float],
    warmup_s: float,
) -> Outcome:
    kvstore = targets[0]
    for target in targets:
        for prompt, tokens in target.completions:
            answer = {"outputs": [tokens], "top2_gaps": [[math.inf] * len(tokens)]}
            oracle.check([prompt], answer)
    figures: dict[str, Any] = {"warmup_s": warmup_s}
    found = _growth_problems(ctx, targets, figures, warmup_s)
    found += _kvstore_problems(final, figures, kvstore, warmup_s)
    figures["server exit codes on SIGTERM"] = {t.label: t.exit_code for t in targets}
    figures["oracle"] = oracle.figures()
    found += oracle.failures
    return Outcome(
        trials=1,
        faults_injected=0,
        passed=not found and oracle.num_diverged == 0,
        requests_served=len(kvstore.completions),
        chunks_lost=None,
        bad_tokens_served=oracle.num_diverged,
        found=found,
        details=figures,
    )


def _growth_problems(
    ctx: RunContext, targets: list[Target], figures: dict[str, Any], warmup_s: float
) -> list[str]:
    """RSS and fd growth of each server after warm-up, and kvstore's against the baseline's."""
    found: list[str] = []
    growth = {}
    for target in targets:
        growth[target.label] = growth_per_1k(target, warmup_s)
        figures[f"{target.label} requests"] = len(target.completions)
        figures[f"{target.label} RSS slope (MB/min; MB per 1000 requests)"] = {
            role: f"{per_min:.2f}; {per_1k:.2f}" for role, (per_min, per_1k) in
            growth[target.label].items()
        }  # fmt: skip
        figures[f"{target.label} open fds (after warm-up -> max)"] = target.fd_span(warmup_s)
        found += [f"{target.label}: request failed: {error}" for error in target.errors[:3]]
        for role, (first, peak) in target.fd_span(warmup_s).items():
            if peak - first > _FD_GROWTH_LIMIT:
                found.append(f"{target.label} {role}: open fds {first} after warm-up, up to {peak}")
    for role in _ENGINE_ROLES if "baseline" in growth else ():
        extra = growth["kvstore"].get(role, (0, 0))[1] - growth["baseline"].get(role, (0, 0))[1]
        figures[f"kvstore's extra RSS growth, {role} (MB per 1000 requests)"] = round(extra, 3)
        if extra > _MARGIN_MB_PER_1K and not ctx.is_smoke:
            found.append(f"{role} with kvstore grows {extra:.2f} MB per 1000 requests faster "
                         "than without")  # fmt: skip
    return found


def _kvstore_problems(
    final: dict[str, float], figures: dict[str, Any], kvstore: Target, warmup_s: float
) -> list[str]:
    def picked(prefix: str) -> dict[str, float]:
        return {k.removeprefix(prefix): v for k, v in final.items() if k.startswith(prefix)}

    found = []
    audit = picked("kvstore_load_audit_chunks_total")
    mismatched = audit.get('{result="mismatched"}', 0.0)
    if mismatched:
        found.append(f"the load audit found {mismatched:g} loaded chunks that differ")
    queued = {k: v for k, v in picked("kvstore_queue_depth").items() if v}
    if queued:
        found.append(f"queues not empty after the load: {queued}")
    held = picked("kvstore_pipeline_inflight")
    if not held:
        found.append("the engine exported no kvstore_pipeline_inflight")
    elif any(held.values()):
        found.append(f"still held after the load: { {k: v for k, v in held.items() if v} }")
    drops = picked("kvstore_queue_dropped_total")
    figures["kvstore queue drops"] = {k: v for k, v in drops.items() if v} or "none"
    figures["kvstore hit tokens"] = picked("kvstore_hit_tokens_total")
    figures["kvstore load audit"] = audit
    figures["kvstore gauges (slope per min after warm-up)"] = kvstore.gauge_slopes(warmup_s)
    return found
