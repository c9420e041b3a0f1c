"""What kvstore costs an engine that gains nothing from it: batches of unique prompts, no hits.

    kvstore bench nohit [--layouts inproc multiproc] [--variants ...] [--repeats 3]
                        [--prompts 8] [--tokens 512] [--reserved-cpus 1] [--check] [--json F]

The real vLLM CPU engine on the 8-layer random Llama of `kvstore bench connector`, one engine
per variant (`nohit_engine.VARIANTS`: no connector, NullConnector, kvstore without disk, kvstore
with its LMDB writes on an engine thread, kvstore as shipped), each in a process of its own, all
up together and measured interleaved, in each layout: `inproc` (the engine in the caller's
process, `VLLM_ENABLE_V1_MULTIPROCESSING=0`, the layout of CUDA's uniproc executor) and
`multiproc` (vLLM's default). Two batches: prefill-heavy (1 output token) and decode-heavy
(`--decode-tokens`). Every engine gets the same core layout: vLLM's CPU platform reserves one
more core for any KV connector, so `VLLM_CPU_NUM_OF_RESERVED_CPU` is set for all of them
(`--reserved-cpus`, stated in the report).

Per batch: wall seconds (median, min-max), their ratio to the engine without a connector
(throughput ratio = none / variant), CPU seconds of the engine's processes and of kvstore's
disk writer (counted until kvstore's writes settled), and the chunks written to disk (a writer
that dropped work would look cheap: the count shows it). `--check` exits 1 unless kvstore as
shipped keeps >= 0.9x the throughput of the engine without a connector in every measured cell.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvstore.bench.child import JsonLineChild
from kvstore.bench.engines import BENCH_SPEC
from kvstore.bench.malloc import add_fixed_malloc_argument, apply_fixed_malloc, malloc_words
from kvstore.bench.nohit_engine import VARIANTS
from kvstore.tiny_model import build_tiny_llama

__all__ = ["CHECK_RATIO", "main"]

CHECK_RATIO = 0.9
BASELINE = "none"


@dataclass
class Cell:
    """One (layout, batch, variant): a list per measured quantity, one value per repeat."""

    values: dict[str, list[float]] = field(default_factory=dict)

    def add(self, answer: dict[str, float]) -> None:
        for name, value in answer.items():
            self.values.setdefault(name, []).append(float(value))

    def median(self, name: str) -> float:
        return statistics.median(self.values[name])


class EngineProcess(JsonLineChild):
    """A `nohit_engine` process and its pipes."""

    def run(self, seeds: list[int], max_tokens: int) -> dict[str, Any]:
        return self.ask({"seeds": seeds, "max_tokens": max_tokens})


def _start(
    args: argparse.Namespace, model: Path, workdir: Path, layout: str, variant: str
) -> EngineProcess:
    kv_tokens = 2 * args.prompts * (args.tokens + args.decode_tokens)
    env = dict(os.environ, VLLM_CPU_NUM_OF_RESERVED_CPU=str(args.reserved_cpus))
    argv = [
        sys.executable, "-m", "kvstore.bench.nohit_engine", str(model), layout, variant,
        str(args.tokens), str(kv_tokens), str(workdir),
    ]  # fmt: skip
    return EngineProcess(argv, env)


def measure(
    args: argparse.Namespace, model: Path, workdir: Path, layout: str
) -> dict[tuple[str, str], Cell]:
    """(batch, variant) -> cell, for one layout; engines started one at a time."""
    (workdir / layout).mkdir(parents=True, exist_ok=True)
    engines: dict[str, EngineProcess] = {}
    cells: dict[tuple[str, str], Cell] = {}
    batches = {"prefill": 1, "decode": args.decode_tokens}
    try:
        for variant in args.variants:
            engines[variant] = _start(args, model, workdir / layout, layout, variant)
            engines[variant].answer()  # ready: started and warmed up, before the next starts
        order = list(args.variants)
        for repeat in range(args.repeats):
            for b, (batch, max_tokens) in enumerate(batches.items()):
                random.Random(repeat * 10 + b).shuffle(order)
                for v, variant in enumerate(order):
                    base = 1_000_000 * (1 + repeat) + 100_000 * b + 1000 * v
                    seeds = [base + i for i in range(args.prompts)]
                    answer = engines[variant].run(seeds, max_tokens)
                    if answer.pop("hit_tokens"):
                        raise RuntimeError(f"{variant}: a no-hit batch hit kvstore's tiers")
                    cells.setdefault((batch, variant), Cell()).add(answer)
    finally:
        for engine in engines.values():
            engine.close()
    return cells


def report(args: argparse.Namespace, results: dict[str, dict[tuple[str, str], Cell]]) -> str:
    lines = [
        f"no-hit batches: {args.prompts} unique prompts of {args.tokens} tokens; prefill = 1 "
        f"output token, decode = {args.decode_tokens}; {os.cpu_count()} cores, "
        f"VLLM_CPU_NUM_OF_RESERVED_CPU={args.reserved_cpus} for every engine, "
        f"{malloc_words(os.environ)}; medians of "
        f"{args.repeats}, interleaved. throughput = {BASELINE} seconds / variant seconds.",
        "",
        "| layout | batch | variant | seconds (min-max) | throughput | engine CPU s "
        "| writer CPU s | disk chunks (dropped) |",
        "|---|---|---|--:|--:|--:|--:|--:|",
    ]
    for layout, cells in results.items():
        for batch in ("prefill", "decode"):
            base = cells[(batch, BASELINE)].median("seconds") if BASELINE in args.variants else 0
            for variant in args.variants:
                cell = cells[(batch, variant)]
                seconds = cell.values["seconds"]
                ratio = f"{base / cell.median('seconds'):.3f}" if base else "-"
                lines.append(
                    f"| {layout} | {batch} | {variant} | {cell.median('seconds'):.3f} "
                    f"({min(seconds):.3f}-{max(seconds):.3f}) | {ratio} | "
                    f"{cell.median('engine_cpu_s'):.2f} | {cell.median('writer_cpu_s'):.2f} | "
                    f"{cell.median('stored'):.0f} ({cell.median('dropped'):.0f}) |"
                )
    lines += ["", "variants:"] + [f"  {v}: {VARIANTS[v]}" for v in args.variants]
    return "\n".join(lines)


def check(results: dict[str, dict[tuple[str, str], Cell]]) -> tuple[bool, str]:
    worst = min(
        (cells[(batch, BASELINE)].median("seconds") / cells[(batch, "kvstore")].median("seconds"),
         f"{layout}/{batch}")
        for layout, cells in results.items()
        for batch in ("prefill", "decode")
    )  # fmt: skip
    ok = worst[0] >= CHECK_RATIO
    verdict = "ok" if ok else "FAILED"
    return ok, f"gate: kvstore no-hit throughput >= {CHECK_RATIO}x no connector: {verdict} " + (
        f"(lowest {worst[0]:.3f}x, {worst[1]})"
    )


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kvstore bench nohit", description=__doc__)
    parser.add_argument("--layouts", nargs="+", choices=["inproc", "multiproc"],
                        default=["inproc", "multiproc"])  # fmt: skip
    parser.add_argument("--variants", nargs="+", choices=list(VARIANTS), default=list(VARIANTS))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=512)
    parser.add_argument("--decode-tokens", type=int, default=32)
    parser.add_argument("--reserved-cpus", type=int, default=1)
    parser.add_argument("--check", action="store_true", help=f"exit 1 below {CHECK_RATIO}x")
    parser.add_argument("--json", type=Path, help="write every measurement as JSON")
    add_fixed_malloc_argument(parser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.check:
        args.variants = list(dict.fromkeys([BASELINE, "kvstore", *args.variants]))
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    apply_fixed_malloc(args.fixed_malloc, os.environ)  # for the engine processes
    with tempfile.TemporaryDirectory(prefix="kvstore-nohit-") as tmp:
        workdir = Path(tmp)
        model = build_tiny_llama(workdir / "model", BENCH_SPEC)
        results: dict[str, dict[tuple[str, str], Cell]] = {}
        for layout in args.layouts:
            results[layout] = measure(args, model, workdir, layout)
            if len(args.layouts) > 1:  # a long run shows each layout as it finishes
                print(report(args, {layout: results[layout]}) + "\n", flush=True)
    print(report(args, results))
    if args.json is not None:
        data = {f"{layout}/{b}/{v}": c.values for layout, cells in results.items()
                for (b, v), c in cells.items()}  # fmt: skip
        args.json.write_text(json.dumps(data, indent=2))
    if BASELINE not in args.variants or "kvstore" not in args.variants:
        return 0
    ok, message = check(results)
    print(message)
    return 0 if ok or not args.check else 1


if __name__ == "__main__":
    sys.exit(main())
