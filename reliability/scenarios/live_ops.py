"""Scenario 5, live operations: `kvstore rm`, `gc` and `verify --repair` in a loop from another
process (`reliability.live_ops`) while one engine serves a shared-prefix workload.

The engine serves batches of prompts drawn from a few families (each family shares a long
prefix, so most of every prompt is a kvstore hit, from CPU or disk) with vLLM's prefix cache
dropped before each batch. Chunks vanish under it at any moment; the promise is that a vanished
chunk is a miss and is recomputed: every sequence matches the run without kvstore, the load
audit finds no loaded chunk that differs, kvstore counts no I/O error or checksum failure and
logs no error, the index is consistent and nothing is left pinned or in flight when it drains,
and the store verifies afterwards.
"""

from __future__ import annotations

import json
import random
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reliability.engines import CHUNK_BYTES, EngineHost, TokenOracle
from reliability.engines import shared_prefix_prompts as prompts_of
from reliability.registry import Outcome, RunContext, scenario
from reliability.store_checks import verify_store

__all__ = ["live_operations"]

_MAX_TOKENS = 8
_ROOT = Path(__file__).resolve().parent.parent.parent
_ENGINE_ERROR = re.compile(r"\b(ERROR|CRITICAL)\b|^Traceback \(most recent call last\)")


def _extra(workdir: Path) -> dict[str, Any]:
    return {
        "cpu_bytes": 24 * CHUNK_BYTES,  # smaller than the working set: disk hits too
        "disk_path": str(workdir / "store"),
        "disk_bytes": 512 * CHUNK_BYTES,
        "region_dir": str(workdir / "shm"),
        "audit_loads": True,
    }


def _serve(
    host: EngineHost, oracle: TokenOracle, pool: list[list[int]], rng: random.Random, s: float
) -> dict[str, int]:
    """Serve random batches from `pool` for `s` seconds; the hits the engine reported."""
    figures = {"batches": 0, "cached_tokens": 0, "prompt_tokens": 0}
    deadline = time.monotonic() + s
    while time.monotonic() < deadline:
        prompts = rng.sample(pool, 4)
        answer = host.call({"op": "generate", "prompts": prompts, "max_tokens": _MAX_TOKENS})
        oracle.check(prompts, answer)
        figures["batches"] += 1
        figures["cached_tokens"] += sum(answer["num_cached_tokens"])
        figures["prompt_tokens"] += sum(len(p) for p in prompts)
    return figures


def _engine_problems(report: dict[str, Any], log: str) -> list[str]:
    counters: dict[str, float] = report["counters"]
    problems = []
    for name, value in counters.items():
        is_error = name.startswith(("kvstore_io_errors_total", "kvstore_checksum_failures_total"))
        is_error |= name.startswith("kvstore_load_audit_chunks_total") and "mismatched" in name
        if (is_error and value) or (name.startswith("kvstore_tier_up") and value == 0):
            problems.append(f"engine counted {name} = {value:g}")
    stuck = {name: count for name, count in report["inflight"].items() if count}
    if stuck:
        problems.append(f"left in flight after draining: {stuck}")
    errors = [line.strip() for line in log.splitlines() if _ENGINE_ERROR.search(line)]
    problems += [f"engine log: {line[:200]}" for line in errors[:5]]
    return problems


@scenario(
    "live-ops",
    number=5,
    title="live operations",
    pass_rule="kvstore rm / gc / verify --repair from another process while the engine serves: "
    "every command exits 0 without a traceback; the engine logs and counts no error (I/O, "
    "checksum, audit mismatch, tier down), drains with nothing pinned or in flight; 0 sequences "
    "diverge; verify exits 0 afterwards",
    timeout_s=600,
    smoke_timeout_s=180,
    needs=("engine",),
    history=(
        "kvstore gc exited 1 ('still 1,310,720 bytes used (limit 1,181,350)') when the engine "
        "wrote between its passes; now it exits 0 once a pass got the store under --max-bytes "
        "and says the engine wrote since, and 1 only if no pass got there",
    ),
)
def live_operations(ctx: RunContext) -> Outcome:
    seconds = ctx.trials(smoke=15, full=180)
    rng = random.Random(ctx.seed + 5)
    pool = prompts_of(rng, num_families=5, per_family=8, prefix_tokens=(96, 224))
    run = _run(ctx, pool, rng, seconds)
    found = list(run.found)
    found += _engine_problems(run.report, run.log)
    verified = verify_store(ctx.workdir / "store")
    if not verified.is_ok:
        found.append(f"verify after the run exited {verified.exit_code}: {verified.error}")
    found += run.oracle.failures
    commands = run.commands
    return Outcome(
        trials=sum(commands.get("num_commands", {}).values()),
        faults_injected=sum(commands.get("num_removed", {}).values()),
        passed=not found and run.oracle.num_diverged == 0,
        requests_served=run.oracle.num_sequences,
        chunks_lost=None,
        bad_tokens_served=run.oracle.num_diverged,
        found=found,
        details=_details(run, seconds),
    )


@dataclass
class _Run:
    oracle: TokenOracle
    served: dict[str, int]
    commands: dict[str, Any]
    report: dict[str, Any]
    log: str
    found: list[str]


def _run(ctx: RunContext, pool: list[list[int]], rng: random.Random, seconds: int) -> _Run:
    """Serve `pool` for `seconds` while `reliability.live_ops` removes and repairs chunks."""
    host = EngineHost(ctx.workdir / "engine.log", name="live-ops engine")
    try:
        model = str(host.call({"op": "model", "dir": str(ctx.workdir / "model")})["dir"])
        oracle = TokenOracle.from_engine(host, model, pool, _MAX_TOKENS)
        log_start = host.log_path.stat().st_size
        host.call({"op": "engine", "model": model, "extra": _extra(ctx.workdir)})
        ops = subprocess.Popen(
            [sys.executable, "-m", "reliability.live_ops", str(ctx.workdir / "store"),
             str(seconds), str(ctx.seed)],
            cwd=_ROOT, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        served = _serve(host, oracle, pool, rng, seconds)
        out, _ = ops.communicate(timeout=120)
        report = host.call({"op": "summary"})
        host.call({"op": "close"})
        with host.log_path.open("rb") as file:
            file.seek(log_start)
            log = file.read().decode(errors="replace")
    finally:
        host.close()
    if ops.returncode != 0:
        failure = f"the live-ops process exited {ops.returncode}"
        return _Run(oracle, served, {}, report, log, [failure])
    commands = json.loads(out)
    return _Run(oracle, served, commands, report, log, list(commands.get("failures", [])))


def _details(run: _Run, seconds: int) -> dict[str, Any]:
    summary = run.report["summary"]
    return {
        "seconds_served": seconds,
        "commands": run.commands.get("num_commands", {}),
        "chunks_removed_by_command": run.commands.get("num_removed", {}),
        "served": run.served,
        "disk_hit_tokens": summary["tiers"]["disk"]["hit_tokens"],
        "cpu_hit_tokens": summary["tiers"]["cpu"]["hit_tokens"],
        "loads_failed_recomputed": summary["load_failed_chunks"],
        "engine's disk removals by reason (a chunk found gone counts as other)": {
            name.partition("reason=")[2].split('"')[1]: value
            for name, value in run.report["counters"].items()
            if name.startswith("kvstore_removed_chunks_total") and 'tier="disk"' in name
        },
        "load_audit": summary["load_audit"],
        "oracle": run.oracle.figures(),
    }
