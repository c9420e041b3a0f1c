"""Time to first token of a long repeated prompt: recomputed vs. loaded from kvstore's tiers.

    kvstore bench connector [--tokens 2048 8192] [--repeats 5] [--layouts multiproc inproc]
                            [--reserved-cpus 1] [--check] [--hybrid] [--plot PNG] [--json F]

The real vLLM CPU engine on an 8-layer random Llama (16 KiB of KV per token), two engines side
by side, one without any KV connector and one with kvstore, in each layout: `multiproc` (vLLM's
default: the engine core, kvstore's halves with it, in a child process) and `inproc`
(`VLLM_ENABLE_V1_MULTIPROCESSING=0`, everything in one process, the shape of vLLM's uniproc
executor on one GPU; each engine is hosted in a process of its own, `kvstore.bench.hosted`).
vLLM's CPU platform reserves one more core for an engine with any KV connector, so both engines
get the same explicit reservation (`VLLM_CPU_NUM_OF_RESERVED_CPU`, `--reserved-cpus`, stated in
the report): the same core layout. For the same prompt, repeated and interleaved across engines:

- recompute: the engine without kvstore prefills the whole prompt again;
- engine_cache: the prompt never left the engine (vLLM's own prefix hit: the floor);
- kvstore_cpu: kvstore loads the prefix from its CPU tier;
- kvstore_disk: the CPU tier has since been filled by other prompts, enough of them that none of
  the prompt's chunks is left in it: LMDB -> CPU row -> engine, with the store file in the page
  cache;
- kvstore_disk_cold: after a restart of the kvstore engine with the store file dropped from the
  page cache (`posix_fadvise`), as a freshly restarted server meets it;
- throughput: a batch of unique prompts (no hits) with kvstore on vs off: what kvstore costs an
  engine that gains nothing (`kvstore bench nohit` measures that in depth);
- with `--hybrid`, then a hybrid model's rows (`kvstore bench hybrid`): bytes stored per prompt
  and CPU hit vs floor, with vLLM's hybrid KV cache manager on and off.

Every timed hit is checked against kvstore's metrics: each row's whole hit (every full chunk
but the one holding the last token) came from the tier it is named for, and none from another.
Ratios are within one run (machines are shared and noisy); medians with min-max. `--check`
(run by CI: the 2048-token prompt, CPU tier, multiprocess layout) exits 1 unless a CPU-tier hit
is at least 2x faster than recompute and the no-hit throughput with kvstore (its disk tier on)
is at least 0.75x without it: the median of 7 paired repeats of both batches, pooled, each
batch of as many prompts (1 to 6) as the engine prefills in about 2 s (timed first). That gate
guards against regressions (writes back on the step path measured 0.61-0.64x, issue 23); it is
not the target, which the report states and checks separately (0.97x, still missed on fast
machines: CI on a 2-core AVX-512/AMX VM measured 0.786x prefill, 0.912x decode, 0.853x pooled).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvstore.bench.engines import BENCH_SPEC, bench_engine, synthetic_prompt
from kvstore.bench.malloc import add_fixed_malloc_argument, apply_fixed_malloc, malloc_words
from kvstore.bench.nohit_batches import NohitBatches, measure_nohit, nohit_ratio, paired_ratios
from kvstore.bench.tiers import drop_page_cache
from kvstore.tiny_model import build_tiny_llama

__all__ = ["NohitBatches", "SizeResult", "main", "measure_nohit", "measure_size"]

_BLOCK_TOKENS = 32  # the engine's block size, and kvstore's chunk (its default)
_GATE_SPEEDUP = 2.0  # --check: a CPU-tier hit must be at least this much faster than recompute

# (path, compared with, most allowed) -- the targets of issue #9, checked in the report
TARGETS: tuple[tuple[str, str, float], ...] = (
    ("kvstore_cpu", "engine_cache", 1.3),
    ("kvstore_disk", "engine_cache", 1.6),
    ("kvstore_disk_cold", "recompute", 0.25),
)
THROUGHPUT_TARGET = 0.97  # issue 23: no-hit throughput, kvstore on / off
# --check: a regression guard below the target. The disk write-through's CPU (the writer's copy
# into the page cache, ~0.05-0.17 CPU s per 48 MiB batch) is taken from an engine that keeps
# both cores of a 2-core machine busy. Multiprocess layout, VLLM_CPU_NUM_OF_RESERVED_CPU=1 for
# both engines, 2-vCPU AVX-512/AMX VMs otherwise idle: pooled medians 0.853x (one CI run),
# 0.917-0.961x (clean-clone runs here), so a 0.9x gate failed on the code's known state.
_GATE_THROUGHPUT = 0.75
_CHECK_NOHIT_REPEATS = 7  # --check: the no-hit batches are short; the hits take 3 repeats


@dataclass
class SizeResult:
    num_tokens: int
    layout: str
    times: dict[str, list[float]] = field(default_factory=dict)
    hit_tokens: dict[str, float] = field(default_factory=dict)
    nohit: dict[str, dict[str, list[float]]] = field(default_factory=dict)
    """batch ("prefill" | "decode") -> engine ("off" | "on") -> seconds per batch"""
    nohit_prompts: int = 0
    """unique prompts per no-hit batch"""

    def median(self, path: str) -> float:
        return statistics.median(self.times[path])


def _cpu_bytes(num_tokens: int) -> int:
    return 2 * num_tokens * BENCH_SPEC.kv_bytes_per_token + (8 << 20)  # two prompts and some


def _store_config(workdir: Path, num_tokens: int, num_prompts: int) -> dict[str, Any]:
    prompt_bytes = num_tokens * BENCH_SPEC.kv_bytes_per_token
    return {
        "cpu_bytes": _cpu_bytes(num_tokens),
        "disk_path": str(workdir / f"store-{num_tokens}"),
        "disk_bytes": int(1.2 * num_prompts * prompt_bytes),
        "disk_queue_chunks": 4 * num_tokens // _BLOCK_TOKENS,  # never drop a write here
    }


def _num_fillers(num_tokens: int) -> int:
    """Prompts to store after the measured one so that none of its chunks is left in the CPU
    tier: together they hold more chunks than the tier has rows (LRU evicts the oldest)."""
    cpu_chunks = _cpu_bytes(num_tokens) // (_BLOCK_TOKENS * BENCH_SPEC.kv_bytes_per_token)
    return cpu_chunks // (num_tokens // _BLOCK_TOKENS) + 1


def measure_size(
    model: Path, workdir: Path, num_tokens: int, repeats: int, *, with_disk: bool = True,
    layout: str = "multiproc", nohit: NohitBatches | None = None, nohit_repeats: int = 0,
    fit_nohit: bool = False,
) -> SizeResult:  # fmt: skip
    """`fit_nohit`: fewer prompts per no-hit batch on a slow machine (`NohitBatches.fitted`,
    from one more timed recompute), as the CI gate runs them."""
    workdir = workdir / layout
    workdir.mkdir(parents=True, exist_ok=True)
    hosted = layout == "inproc"
    paths = ("recompute", "engine_cache", "kvstore_cpu")
    result = SizeResult(num_tokens, layout, {p: [] for p in paths})
    if with_disk:
        result.times.update(kvstore_disk=[])
    hit = (num_tokens - 1) // _BLOCK_TOKENS * _BLOCK_TOKENS
    num_fillers = _num_fillers(num_tokens)
    nohit_prompts = 0
    if nohit is not None:
        # both batches, on kvstore's engine: the timed repeats and the warm-up round
        batches_on = 2 * ((nohit_repeats or repeats) + 1)
        nohit_prompts = batches_on * nohit.num_tokens // num_tokens + 1
    config = _store_config(workdir, num_tokens, (num_fillers + 1) * repeats + 2 + nohit_prompts)
    prompts = [synthetic_prompt(100 + r, num_tokens) for r in range(repeats)]
    with (
        bench_engine(model, num_tokens, has_connector=False, hosted=hosted) as off,
        bench_engine(model, num_tokens, kvstore=config, hosted=hosted) as on,
    ):
        off.ttft_s(synthetic_prompt(1, num_tokens))  # one-off costs of a new engine
        on.ttft_s(synthetic_prompt(2, num_tokens))
        if nohit is not None:  # first: their chunks are the oldest, the first evicted
            if fit_nohit:
                nohit = nohit.fitted(off.ttft_s(synthetic_prompt(3, num_tokens)), num_tokens)
            result.nohit = measure_nohit(off, on, nohit_repeats or repeats, nohit)
            result.nohit_prompts = nohit.prompts
        for r, prompt in enumerate(prompts):
            result.times["recompute"].append(off.ttft_s(prompt))
            result.times["engine_cache"].append(off.ttft_s(prompt))
            off.reset_prefix_cache()
            on.ttft_s(prompt)  # computed and stored
            on.wait_settled()
            on.reset_prefix_cache()
            with on.expect_hits("cpu", hit, is_sole_tier=True):
                result.times["kvstore_cpu"].append(on.ttft_s(prompt))
            if not with_disk:
                continue
            for k in range(num_fillers):  # the prompt is now on disk only
                on.ttft_s(synthetic_prompt(1000 + 10 * r + k, num_tokens))
                on.wait_settled()
            on.reset_prefix_cache()
            with on.expect_hits("disk", hit, is_sole_tier=True):
                result.times["kvstore_disk"].append(on.ttft_s(prompt))
            on.wait_settled()
        result.hit_tokens = dict(zip(("cpu", "disk"), on.hit_tokens(), strict=True))
    if with_disk:
        result.times["kvstore_disk_cold"] = _cold_disk_hits(model, config, prompts, hit, hosted)
    return result


def _cold_disk_hits(
    model: Path, config: dict[str, Any], prompts: list[list[int]], hit: int, hosted: bool
) -> list[float]:
    """A restarted kvstore engine meets the store with its file out of the page cache."""
    drop_page_cache(Path(config["disk_path"]) / "data.mdb")
    times = []
    with bench_engine(model, len(prompts[0]), kvstore=config, hosted=hosted) as on:
        for prompt in prompts:
            with on.expect_hits("disk", hit, is_sole_tier=True):
                times.append(on.ttft_s(prompt))
    return times


# -- report -----------------------------------------------------------------------------------


def _row(name: str, values: Sequence[float], base: float, floor: float) -> str:
    median = statistics.median(values)
    spread = f"{min(values):.3f}-{max(values):.3f}"
    return f"| {name} | {median:.3f} | {spread} | {median / base:.2f} | {median / floor:.2f} |"


def report(sizes: Sequence[SizeResult]) -> str:
    lines = []
    for size in sizes:
        mib = size.num_tokens * BENCH_SPEC.kv_bytes_per_token / 2**20
        base, floor = size.median("recompute"), size.median("engine_cache")
        lines += [
            f"prompt {size.num_tokens} tokens, {mib:.0f} MiB of KV, {size.layout} layout, "
            f"{len(size.times['recompute'])} interleaved repeats, {os.cpu_count()} cores, "
            f"VLLM_CPU_NUM_OF_RESERVED_CPU={os.environ.get('VLLM_CPU_NUM_OF_RESERVED_CPU')} "
            f"for both engines, {malloc_words(os.environ)}",
            "",
            "| path | TTFT median s | min-max s | vs recompute | vs floor |",
            "|---|--:|--:|--:|--:|",
        ]
        lines += [_row(name, values, base, floor) for name, values in size.times.items()]
        lines.append("")
        for path, against, most in TARGETS:
            if path in size.times:
                ratio = size.median(path) / size.median(against)
                verdict = "met" if ratio <= most else "MISSED"
                lines.append(f"- {path} <= {most}x {against}: {ratio:.2f} ({verdict})")
        for batch, times in size.nohit.items():
            ratio = nohit_ratio(times)
            verdict = "met" if ratio >= THROUGHPUT_TARGET else "MISSED"
            lines.append(
                f"- no-hit {batch} batch ({size.nohit_prompts} unique "
                f"prompt{'s' if size.nohit_prompts != 1 else ''}), kvstore on "
                f"{ratio:.3f}x off (target >= "
                f"{THROUGHPUT_TARGET}: {verdict}); seconds per batch off "
                f"{_spread(times['off'])}, on {_spread(times['on'])}"
            )
        lines.append("")
    return "\n".join(lines)


def _spread(values: Sequence[float]) -> str:
    return f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"


def gate(size: SizeResult) -> tuple[bool, str]:
    speedup = size.median("recompute") / size.median("kvstore_cpu")
    ok = speedup >= _GATE_SPEEDUP
    message = (
        f"check: a CPU-tier hit of {size.num_tokens} tokens is {speedup:.1f}x faster than "
        f"recompute (gate >= {_GATE_SPEEDUP}x): {'ok' if ok else 'FAILED'}"
    )
    if not size.nohit:
        return ok, message + "; no-hit throughput not measured"
    # both batches pooled: one slow moment of a shared machine moves a median of 14 pairs less
    ratios = [r for times in size.nohit.values() for r in paired_ratios(times)]
    ratio = statistics.median(ratios)
    ok_nohit = ratio >= _GATE_THROUGHPUT
    return ok and ok_nohit, message + (
        f"; no-hit throughput with kvstore {ratio:.3f}x without (median of {len(ratios)} "
        f"paired batches, prefill and decode, {size.layout}"
        f"; gate >= {_GATE_THROUGHPUT}x): {'ok' if ok_nohit else 'FAILED'}"
    )


def plot(sizes: Sequence[SizeResult], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(sizes), figsize=(5.5 * len(sizes), 4), squeeze=False)
    for ax, size in zip(axes[0], sizes, strict=True):
        names = list(size.times)
        medians = [size.median(n) for n in names]
        ax.bar(names, medians, color=["#999", "#4a4", "#36c", "#c63", "#933"][: len(names)])
        ax.set_yscale("log")
        ax.set_ylabel("time to first token, s (median)")
        ax.set_title(f"{size.num_tokens}-token prompt, {size.layout}")
        ax.tick_params(axis="x", rotation=30)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="kvstore bench connector", description=__doc__)
    parser.add_argument("--tokens", type=int, nargs="+", default=[2048, 8192])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--check", action="store_true", help="CI gate: 2048 tokens, CPU tier")
    parser.add_argument("--plot", type=Path, help="write a bar chart (needs matplotlib)")
    parser.add_argument("--json", type=Path, help="write the raw times as JSON")
    parser.add_argument("--no-throughput", action="store_true", help="skip the no-hit batches")
    parser.add_argument("--layouts", nargs="+", choices=["multiproc", "inproc"],
                        default=["multiproc", "inproc"])  # fmt: skip
    parser.add_argument("--reserved-cpus", type=int, default=1,
                        help="VLLM_CPU_NUM_OF_RESERVED_CPU of both engines")  # fmt: skip
    parser.add_argument("--hybrid", action="store_true",
                        help="then the hybrid-model rows (`kvstore bench hybrid`, the first size, "
                        "in-process)")  # fmt: skip
    add_fixed_malloc_argument(parser)
    args = parser.parse_args(argv)
    layouts = ["multiproc"] if args.check else args.layouts
    tokens = [2048] if args.check else args.tokens
    nohit = None if args.no_throughput and not args.check else NohitBatches()
    if nohit is not None and nohit.tokens + nohit.decode_tokens > tokens[0]:
        parser.error(f"the no-hit batches run on the first size's engines and need requests of "
                     f"{nohit.tokens + nohit.decode_tokens} tokens: list a size at least that "
                     "large first in --tokens, or pass --no-throughput")  # fmt: skip
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")  # for the engines this run starts
    os.environ["VLLM_CPU_NUM_OF_RESERVED_CPU"] = str(args.reserved_cpus)
    apply_fixed_malloc(args.fixed_malloc, os.environ)  # for the engines this run starts
    with tempfile.TemporaryDirectory(prefix="kvstore-bench-") as tmp:
        workdir = Path(tmp)
        model = build_tiny_llama(workdir / "model", BENCH_SPEC)
        nohit_repeats = _CHECK_NOHIT_REPEATS if args.check else 0
        sizes = []
        for layout in layouts:
            for i, n in enumerate(tokens):  # the no-hit batches once per layout
                size = measure_size(model, workdir, n, args.repeats, with_disk=not args.check,
                                    layout=layout, nohit=None if i else nohit,
                                    nohit_repeats=nohit_repeats,
                                    fit_nohit=args.check)  # fmt: skip
                sizes.append(size)
                print(report([size]), flush=True)  # a long run shows each as it finishes
    if len(sizes) > 1:
        print(report(sizes))
    if args.json is not None:
        data = {"sizes": [s.__dict__ for s in sizes]}
        args.json.write_text(json.dumps(data, indent=2))
    if args.plot is not None:
        plot(sizes, args.plot)
    ok, message = gate(sizes[0])
    print(message)
    if args.hybrid:
        from kvstore.bench import hybrid

        hybrid.main(["--tokens", str(tokens[0]), "--repeats", str(args.repeats)])
    return 0 if ok or not args.check else 1


if __name__ == "__main__":
    sys.exit(main())
