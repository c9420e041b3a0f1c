"""Serving with vLLM's own benchmark client: kvstore vs the same server without it.

    kvstore bench serve [--quick] [--out DIR] [--targets baseline kvstore lmcache]
                        [--reserved-cpus 1] [--prefix-len 2048] [--num-prefixes 8] ...

`vllm bench serve` (`kvstore.vllm.bench_client`) with the `prefix_repetition` dataset (random
shared prefixes, each followed by random suffixes, in shuffled order) against vLLM's OpenAI
server (`python -m vllm.entrypoints.openai.api_server`, vLLM's default multiprocess layout: the
API server and an EngineCore process) on the 8-layer random Llama of `kvstore bench connector`
with a word-level tokenizer built locally (one word per token id, so the dataset's random
prompts have exactly the lengths asked for). The engine's KV cache holds fewer tokens than the
prefixes together, so its own prefix cache cannot keep them all. Targets, one server at a
time, each warmed up with one unrelated request first:

- `baseline`: the server without any KV connector;
- `kvstore`: the same server with KVStoreConnector, a CPU tier (by default halfway between
  the engine's cache and every prompt) and a disk tier (every prompt, twice);
- `lmcache`: LMCache's MP server and `LMCacheMPConnector`, when `lmcache` is importable
  (else the report says it was skipped).

Every server gets the same `VLLM_CPU_NUM_OF_RESERVED_CPU` (`--reserved-cpus`, default 1): vLLM
reserves one more core for an engine with any connector. Per target: mean/median/p99 TTFT,
request and output-token throughput (vLLM's client), and where the prompt tokens came from
(vLLM's `prompt_tokens_by_source` and `prompt_tokens_cached_by_source` counters, scraped
before and after the run); ratios to `baseline` in the same run. Writes `serve.json`,
`serve.png` and the servers' and clients' logs to `--out`. vLLM's multi-turn benchmark is not
in the wheel (it lives in vLLM's repository); the report says so. One run per target: the
ratios carry this machine's noise.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import random
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from kvstore.bench.engines import BENCH_SPEC, free_port
from kvstore.bench.serve_args import BLOCK_TOKENS, TARGETS, parse_args, round_up, workload_of
from kvstore.bench.serve_client import client_argv
from kvstore.bench.serve_report import TargetResult, format_report, plot_report, ratios
from kvstore.bench.serve_server import (
    LMCACHE_SERVER,
    Server,
    ServerSpec,
    prompt_sources,
    wait_for_port,
)
from kvstore.tiny_model import add_word_tokenizer, build_tiny_llama
from kvstore.vllm.engine import kv_transfer_config

__all__ = ["TARGETS", "main", "parse_args"]

_CLIENT_TIMEOUT_S = 1800
_MULTI_TURN_MODULE = "vllm.benchmarks.multi_turn"


def _say(message: str) -> None:
    print(f"· {message}", file=sys.stderr, flush=True)


def skip_reasons(targets: Sequence[str]) -> dict[str, str]:
    """Targets (and workloads) that cannot run here, and why."""
    skipped = {}
    if "lmcache" in targets and importlib.util.find_spec("lmcache") is None:
        skipped["lmcache"] = "lmcache not installed (pip install lmcache; an optional extra)"
    if importlib.util.find_spec(_MULTI_TURN_MODULE) is None:
        skipped["multi-turn workload"] = (
            "vLLM's multi-turn benchmark (benchmarks/multi_turn/ in vLLM's repository) is not "
            "in the installed vllm wheel; only prefix_repetition ran"
        )
    else:
        skipped["multi-turn workload"] = f"{_MULTI_TURN_MODULE} found, not driven by this suite"
    return skipped


def _server(args: argparse.Namespace, spec: ServerSpec, target: str) -> Server:
    log = args.out / f"{target}-server.log"
    if target == "baseline":
        return Server(spec, None, log)
    if target == "kvstore":
        store = args.out / "kvstore-store"
        shutil.rmtree(store, ignore_errors=True)  # a fresh store: hits only from this run
        transfer = kv_transfer_config(
            cpu_bytes=args.cpu_bytes, disk_path=str(store), disk_bytes=args.disk_bytes
        )
        return Server(spec, transfer, log)
    port = free_port()
    memory_gb = (args.cpu_bytes + args.disk_bytes) / (1 << 30)  # kvstore's CPU + disk, in DRAM
    extra = args.lmcache_server_args or (  # LMCache 0.5.6's flags
        f"--l1-size-gb {memory_gb:.3f} --eviction-policy LRU --supported-transfer-mode auto"
    )
    helper = [
        sys.executable,
        "-m",
        LMCACHE_SERVER,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        *extra.split(),
    ]
    transfer = {
        "kv_connector": "LMCacheMPConnector",
        "kv_role": "kv_both",
        "kv_connector_extra_config": {
            "lmcache.mp.host": "tcp://127.0.0.1",
            "lmcache.mp.port": port,
            "lmcache.mp.mp_transfer_mode": "lmcache_driven",  # shared memory on the CPU
        },
    }
    server = Server(spec, transfer, log, helper_command=helper)
    wait_for_port(port, 10)
    return server


def _run_target(args: argparse.Namespace, spec: ServerSpec, target: str) -> TargetResult:
    workload = workload_of(args)
    started = time.monotonic()
    server = _server(args, spec, target)
    try:
        _say(f"{target}: server up in {time.monotonic() - started:.0f} s, warming up")
        warm = random.Random(10**6 + args.seed)  # unrelated to the dataset's prompts
        prompt_len = workload.prefix_len + workload.suffix_len
        server.complete([warm.randrange(3, BENCH_SPEC.vocab_size) for _ in range(prompt_len)], 2)
        before = server.metrics()
        _say(f"{target}: vllm bench serve, {workload.num_prompts} requests")
        result_file = f"{target}-vllm-bench.json"
        argv = client_argv(workload, server.url, spec.model, args.out, result_file)
        with (args.out / f"{target}-client.log").open("wb") as log:
            subprocess.run(
                [sys.executable, "-m", "kvstore.vllm.bench_client", *argv],
                stdout=log,
                stderr=subprocess.STDOUT,
                check=True,
                timeout=_CLIENT_TIMEOUT_S,
            )
        time.sleep(1.0)  # the last steps' stats reach the API server's metrics
        sources = prompt_sources(before, server.metrics())
    finally:
        server.close()
    bench = json.loads((args.out / result_file).read_text())
    expected = workload.num_prompts * (workload.prefix_len + workload.suffix_len)
    if bench.get("total_input_tokens") != expected:  # the tokenizer did not round-trip
        _say(f"{target}: {bench.get('total_input_tokens')} prompt tokens sent, {expected} asked")
    return TargetResult(target, _DESCRIPTIONS[target], bench, sources)


_DESCRIPTIONS = {
    "baseline": "vLLM's OpenAI server without a KV connector",
    "kvstore": "the same server with KVStoreConnector (CPU + disk tiers)",
    "lmcache": "the same server with LMCacheMPConnector and LMCache's MP server",
}


def _cpu_model() -> str:
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return "unknown CPU"
    model = next(
        (ln.split(":", 1)[1].strip() for ln in info.splitlines() if ln.startswith("model name")),
        "unknown CPU",
    )
    flags = info.split()
    extras = [name for name, flag in (("AVX-512", "avx512f"), ("AMX", "amx_tile")) if flag in flags]
    return f"{model} ({', '.join(extras) or 'no AVX-512/AMX'})"


def machine(reserved_cpus: int) -> dict[str, Any]:
    """What every figure needs beside it: cores, CPU, load, layout, reservation."""
    return {
        "cores": os.cpu_count(),
        "cpu": _cpu_model(),
        "load_average_1m_start": os.getloadavg()[0],
        "layout": "multiprocess: vLLM's OpenAI server and its EngineCore process (the default)",
        "reserved_cpus": reserved_cpus,
    }


def _header(args: argparse.Namespace, info: dict[str, Any]) -> list[str]:
    w = workload_of(args)
    return [
        f"machine: {info['cores']} cores, {info['cpu']}, load average (1 min) "
        f"{info['load_average_1m_start']:.2f} at the start, {info['load_average_1m_end']:.2f} "
        f"at the end",
        f"layout: {info['layout']}; VLLM_CPU_NUM_OF_RESERVED_CPU={args.reserved_cpus} for every "
        f"server",
        f"workload: vLLM's prefix_repetition, {w.num_prefixes} prefixes x {w.prefix_len} tokens, "
        f"{w.num_prompts} requests (+{w.suffix_len}-token suffixes, {w.output_len} tokens out), "
        f"shuffled, {w.max_concurrency} in flight",
        f"engine KV cache {args.engine_cache_tokens:,} tokens (prefixes: "
        f"{w.num_prefixes * w.prefix_len:,}); kvstore CPU tier {args.cpu_bytes >> 20} MiB, disk "
        f"{args.disk_bytes >> 20} MiB; model: 8-layer random Llama, bf16, "
        f"{BENCH_SPEC.kv_bytes_per_token >> 10} KiB KV per token",
    ]


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv, __doc__)
    args.out.mkdir(parents=True, exist_ok=True)
    info = machine(args.reserved_cpus)
    skipped = skip_reasons(args.targets)
    model = build_tiny_llama(args.out / "model", BENCH_SPEC)
    add_word_tokenizer(model, BENCH_SPEC.vocab_size)
    w = workload_of(args)
    spec = ServerSpec(
        model.resolve(),
        round_up(w.request_tokens + 64, BLOCK_TOKENS),
        args.engine_cache_tokens * BENCH_SPEC.kv_bytes_per_token,
        BENCH_SPEC.dtype,
        args.reserved_cpus,
    )
    results = {}
    for target in args.targets:
        if target in skipped:
            _say(f"{target}: skipped: {skipped[target]}")
            continue
        results[target] = _run_target(args, spec, target)
    info["load_average_1m_end"] = os.getloadavg()[0]
    print(format_report(results, skipped, _header(args, info)))
    _write(args, info, results, skipped)
    return 0


def _write(
    args: argparse.Namespace,
    info: dict[str, Any],
    results: dict[str, TargetResult],
    skipped: dict[str, str],
) -> None:
    keep = (
        "completed",
        "failed",
        "duration",
        "total_input_tokens",
        "total_output_tokens",
        "mean_ttft_ms",
        "median_ttft_ms",
        "p99_ttft_ms",
        "p50_ttft_ms",
        "std_ttft_ms",
        "request_throughput",
        "output_throughput",
        "mean_tpot_ms",
        "mean_e2el_ms",
    )
    document = {
        "machine": info,
        "workload": asdict(workload_of(args)),
        "engine_cache_tokens": args.engine_cache_tokens,
        "kvstore": {"cpu_bytes": args.cpu_bytes, "disk_bytes": args.disk_bytes},
        "targets": {
            name: {
                "description": r.description,
                "sources": dict(r.sources),
                **{k: r.bench[k] for k in keep if k in r.bench},
            }
            for name, r in results.items()
        },
        "ratios_to_baseline": ratios(results),
        "skipped": skipped,
    }
    (args.out / "serve.json").write_text(json.dumps(document, indent=2) + "\n")
    if results:
        title = (
            f"vllm bench serve, prefix_repetition: {info['cores']} cores, multiprocess, "
            f"reserved CPUs {args.reserved_cpus}"
        )
        plot_report(results, args.out / "serve.png", title)
    _say(f"wrote {args.out / 'serve.json'} and {args.out / 'serve.png'}")


if __name__ == "__main__":
    sys.exit(main())
