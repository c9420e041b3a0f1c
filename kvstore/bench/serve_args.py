"""The options of `kvstore bench serve`: parsed, checked (a bad value exits 2 with a message
naming it and what is allowed), and completed with the workload's defaults and derived sizes."""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from pathlib import Path

from kvstore.bench.engines import BENCH_SPEC
from kvstore.bench.serve_client import Workload

__all__ = ["BLOCK_TOKENS", "TARGETS", "parse_args", "round_up", "workload_of"]

TARGETS = ("baseline", "kvstore", "lmcache")
BLOCK_TOKENS = 32
_WORKLOADS = {  # prefix, suffix, prefixes, prompts, output tokens
    "default": (2048, 128, 8, 32, 16),
    "quick": (512, 32, 4, 12, 8),
}


def _parser(description: str | None) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="kvstore bench serve",
        description=description,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="small workload: 4 prefixes of 512 tokens, 12 prompts, 8 tokens out",
    )
    p.add_argument(
        "--out",
        type=Path,
        default=Path(".kvstore/bench-serve"),
        help="directory for serve.json, serve.png, logs, the model and the store",
    )
    p.add_argument("--targets", nargs="+", choices=TARGETS, default=list(TARGETS))
    p.add_argument(
        "--reserved-cpus",
        type=int,
        default=1,
        help="VLLM_CPU_NUM_OF_RESERVED_CPU for every server (default 1)",
    )
    p.add_argument("--prefix-len", type=int, help="tokens per shared prefix (default 2048)")
    p.add_argument("--suffix-len", type=int, help="tokens per unique suffix (default 128)")
    p.add_argument("--num-prefixes", type=int, help="distinct prefixes (default 8)")
    p.add_argument("--num-prompts", type=int, help="requests, a multiple of --num-prefixes")
    p.add_argument("--output-len", type=int, help="tokens generated per request (default 16)")
    p.add_argument("--max-concurrency", type=int, default=2, help="requests in flight")
    p.add_argument("--seed", type=int, default=0, help="the dataset's seed")
    p.add_argument(
        "--engine-cache-tokens",
        type=int,
        help="the engine's own KV cache (default: max-concurrency + 1 requests)",
    )
    p.add_argument(
        "--cpu-bytes",
        type=int,
        help="kvstore's CPU tier (default: between the engine cache and all prompts)",
    )
    p.add_argument("--disk-bytes", type=int, help="kvstore's disk tier (default: 2x the prompts)")
    p.add_argument(
        "--lmcache-server-args",
        default=None,
        help="arguments of LMCache's MP server (default: --l1-size-gb, kvstore's CPU + disk bytes)",
    )
    return p


def round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def parse_args(
    argv: Sequence[str] | None = None, description: str | None = None
) -> argparse.Namespace:
    """Parse and check; a bad value exits 2 with a message naming it and what is allowed.
    Fills in the workload's defaults (`--quick` or not) and the derived sizes."""
    parser = _parser(description)
    args = parser.parse_args(argv)
    defaults = _WORKLOADS["quick" if args.quick else "default"]
    names = ("prefix_len", "suffix_len", "num_prefixes", "num_prompts", "output_len")
    for name, default in zip(names, defaults, strict=True):
        if getattr(args, name) is None:
            setattr(args, name, default)
    try:
        _check(args)
    except ValueError as exc:
        parser.error(str(exc))
    return args


def _check(args: argparse.Namespace) -> None:
    """Raise ValueError naming the first bad value and what is allowed."""
    for name in ("suffix_len", "num_prefixes", "num_prompts", "output_len", "max_concurrency"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} {getattr(args, name)}: must be >= 1")
    if args.prefix_len < BLOCK_TOKENS:
        raise ValueError(f"--prefix-len {args.prefix_len}: must be >= {BLOCK_TOKENS} (one block)")
    if args.num_prompts % args.num_prefixes:
        raise ValueError(
            f"--num-prompts {args.num_prompts}: must be a multiple of "
            f"--num-prefixes {args.num_prefixes} (vLLM drops the remainder)"
        )
    cores = os.cpu_count() or 1
    if not 0 <= args.reserved_cpus < cores:
        raise ValueError(f"--reserved-cpus {args.reserved_cpus}: must be in 0..{cores - 1}")
    _check_sizes(args)


def _check_sizes(args: argparse.Namespace) -> None:
    """The engine's cache against the workload; kvstore's tiers (filled in when not given)."""
    workload = workload_of(args)
    if workload.request_tokens + 64 > BENCH_SPEC.max_position_embeddings:
        raise ValueError(
            f"requests of {workload.request_tokens} tokens: the model takes at "
            f"most {BENCH_SPEC.max_position_embeddings - 64}"
        )
    in_flight = args.max_concurrency * round_up(workload.request_tokens, BLOCK_TOKENS)
    if args.engine_cache_tokens is None:
        args.engine_cache_tokens = in_flight + round_up(workload.request_tokens, BLOCK_TOKENS)
    if args.engine_cache_tokens < in_flight:
        raise ValueError(
            f"--engine-cache-tokens {args.engine_cache_tokens}: must hold the "
            f"{args.max_concurrency} requests in flight ({in_flight} tokens)"
        )
    prefixes = args.num_prefixes * args.prefix_len
    if args.engine_cache_tokens >= prefixes:
        raise ValueError(
            f"--engine-cache-tokens {args.engine_cache_tokens}: must be below the "
            f"prefixes' {prefixes} tokens, or the engine's own cache holds them all"
        )
    prompt_bytes = workload.unique_prompt_tokens * BENCH_SPEC.kv_bytes_per_token
    if args.cpu_bytes is None:  # more than the engine's cache, less than every prompt
        cpu_tokens = (args.engine_cache_tokens + workload.unique_prompt_tokens) // 2
        args.cpu_bytes = cpu_tokens * BENCH_SPEC.kv_bytes_per_token
    args.disk_bytes = 2 * prompt_bytes + (64 << 20) if args.disk_bytes is None else args.disk_bytes
    chunk_bytes = BLOCK_TOKENS * BENCH_SPEC.kv_bytes_per_token
    if "kvstore" in args.targets and min(args.cpu_bytes, args.disk_bytes) < 4 * chunk_bytes:
        raise ValueError(
            f"--cpu-bytes {args.cpu_bytes} / --disk-bytes {args.disk_bytes}: "
            f"each must hold at least 4 chunks of {chunk_bytes} bytes"
        )


def workload_of(args: argparse.Namespace) -> Workload:
    return Workload(
        args.prefix_len,
        args.suffix_len,
        args.num_prefixes,
        args.num_prompts,
        args.output_len,
        args.max_concurrency,
        args.seed,
    )
