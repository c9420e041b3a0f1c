"""Time to first token of a long repeated prompt: recomputed vs. loaded from kvstore's tiers.

    kvstore bench connector [--tokens 2048 8192] [--repeats 5] [--check] [--plot PNG] [--json]

The real vLLM CPU engine on an 8-layer random Llama (16 KiB of KV per token), two engines side
by side in their own processes (vLLM's default), one without kvstore and one with it. The one
"without" runs `NullConnector`, a KV connector that moves nothing: vLLM gives an engine with any
connector another core layout (see kvstore/vllm/null_connector.py), so that is the fair
baseline. For the same prompt, repeated and interleaved across the engines:

- recompute: NullConnector, the engine prefills the whole prompt again;
- engine_cache: the prompt never left the engine (vLLM's own prefix hit: the floor);
- kvstore_cpu: kvstore loads the prefix from its CPU tier;
- kvstore_disk: the CPU tier has since been filled by other prompts, enough of them that none of
  the prompt's chunks is left in it: LMDB -> CPU row -> engine, with the store file in the page
  cache;
- kvstore_disk_cold: after a restart of the kvstore engine with the store file dropped from the
  page cache (`posix_fadvise`), as a freshly restarted server meets it;
- throughput: a batch of unique prompts (no hits) with kvstore on vs off (NullConnector): what
  kvstore costs an engine that gains nothing.

Every timed hit is checked against kvstore's metrics: each row's whole hit (every full chunk
but the one holding the last token) came from the tier it is named for, and none from another.
Ratios are within one run (machines are shared and noisy); medians with min-max. `--check`
exits 1 unless a CPU-tier hit is at least 2x faster than recompute (a gate with a wide margin,
run by CI on the 2048-token prompt only).
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
from kvstore.bench.tiers import drop_page_cache
from kvstore.tiny_model import build_tiny_llama

__all__ = ["SizeResult", "main", "measure_size", "measure_throughput"]

_BLOCK_TOKENS = 32  # the engine's block size, and kvstore's chunk (its default)
_GATE_SPEEDUP = 2.0  # --check: a CPU-tier hit must be at least this much faster than recompute

# (path, compared with, most allowed) -- the targets of issue #9, checked in the report
TARGETS: tuple[tuple[str, str, float], ...] = (
    ("kvstore_cpu", "engine_cache", 1.3),
    ("kvstore_disk", "engine_cache", 1.6),
    ("kvstore_disk_cold", "recompute", 0.25),
)
THROUGHPUT_TARGET = 0.97


@dataclass
class SizeResult:
    num_tokens: int
    times: dict[str, list[float]] = field(default_factory=dict)
    hit_tokens: dict[str, float] = field(default_factory=dict)

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
    model: Path, workdir: Path, num_tokens: int, repeats: int, *, with_disk: bool = True
) -> SizeResult:
    result = SizeResult(num_tokens, {p: [] for p in ("recompute", "engine_cache", "kvstore_cpu")})
    if with_disk:
        result.times.update(kvstore_disk=[])
    hit = (num_tokens - 1) // _BLOCK_TOKENS * _BLOCK_TOKENS
    num_fillers = _num_fillers(num_tokens)
    config = _store_config(workdir, num_tokens, (num_fillers + 1) * repeats + 2)
    prompts = [synthetic_prompt(100 + r, num_tokens) for r in range(repeats)]
    with (
        bench_engine(model, num_tokens) as off,
        bench_engine(model, num_tokens, kvstore=config) as on,
    ):
        off.ttft_s(synthetic_prompt(1, num_tokens))  # one-off costs of a new engine
        on.ttft_s(synthetic_prompt(2, num_tokens))
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
        result.times["kvstore_disk_cold"] = _cold_disk_hits(model, config, prompts, hit)
    return result


def _cold_disk_hits(
    model: Path, config: dict[str, Any], prompts: list[list[int]], hit: int
) -> list[float]:
    """A restarted kvstore engine meets the store with its file out of the page cache."""
    drop_page_cache(Path(config["disk_path"]) / "data.mdb")
    times = []
    with bench_engine(model, len(prompts[0]), kvstore=config) as on:
        for prompt in prompts:
            with on.expect_hits("disk", hit, is_sole_tier=True):
                times.append(on.ttft_s(prompt))
    return times


def measure_throughput(
    model: Path, workdir: Path, repeats: int, *, num_prompts: int = 8, num_tokens: int = 1024,
    max_tokens: int = 32,
) -> dict[str, list[float]]:  # fmt: skip
    """Seconds per batch of unique prompts (no hits), kvstore off vs on, interleaved."""
    kv_tokens = 2 * num_prompts * (num_tokens + max_tokens)
    config = _store_config(workdir, num_tokens, num_prompts * (repeats + 1))
    config["cpu_bytes"] = num_prompts * num_tokens * BENCH_SPEC.kv_bytes_per_token  # one batch
    times: dict[str, list[float]] = {"off": [], "on": []}
    with (
        bench_engine(model, num_tokens, kv_cache_tokens=kv_tokens) as off,
        bench_engine(model, num_tokens, kv_cache_tokens=kv_tokens, kvstore=config) as on,
    ):
        for engine, seed in ((off, 3), (on, 4)):  # warm up
            engine.batch_s([synthetic_prompt(seed, num_tokens)], max_tokens)
        for r in range(repeats):
            for name, engine in (("off", off), ("on", on)):
                seeds = [10_000 + 1000 * r + 100 * (name == "on") + i for i in range(num_prompts)]
                batch = [synthetic_prompt(s, num_tokens) for s in seeds]
                times[name].append(engine.batch_s(batch, max_tokens))
        hits = on.hit_tokens()
        if sum(hits) > 0:
            raise RuntimeError(f"the throughput batches must not hit, kvstore served {hits}")
    return times


# -- report -----------------------------------------------------------------------------------


def _row(name: str, values: Sequence[float], base: float, floor: float) -> str:
    median = statistics.median(values)
    spread = f"{min(values):.3f}-{max(values):.3f}"
    return f"| {name} | {median:.3f} | {spread} | {median / base:.2f} | {median / floor:.2f} |"


def report(sizes: Sequence[SizeResult], throughput: dict[str, list[float]] | None) -> str:
    lines = []
    for size in sizes:
        mib = size.num_tokens * BENCH_SPEC.kv_bytes_per_token / 2**20
        base, floor = size.median("recompute"), size.median("engine_cache")
        lines += [
            f"prompt {size.num_tokens} tokens, {mib:.0f} MiB of KV, "
            f"{len(size.times['recompute'])} interleaved repeats",
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
        lines.append("")
    if throughput is not None:
        ratio = statistics.median(throughput["off"]) / statistics.median(throughput["on"])
        verdict = "met" if ratio >= THROUGHPUT_TARGET else "MISSED"
        lines.append(
            f"throughput, no hits: kvstore on {ratio:.3f}x off (NullConnector) "
            f"(target >= {THROUGHPUT_TARGET}: {verdict}); batch seconds "
            f"off {_spread(throughput['off'])}, on {_spread(throughput['on'])}"
        )
    return "\n".join(lines)


def _spread(values: Sequence[float]) -> str:
    return f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"


def gate(size: SizeResult) -> tuple[bool, str]:
    speedup = size.median("recompute") / size.median("kvstore_cpu")
    ok = speedup >= _GATE_SPEEDUP
    return ok, (
        f"check: a CPU-tier hit of {size.num_tokens} tokens is {speedup:.1f}x faster than "
        f"recompute (gate >= {_GATE_SPEEDUP}x): {'ok' if ok else 'FAILED'}"
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
        ax.set_title(f"{size.num_tokens}-token prompt")
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
    parser.add_argument("--no-throughput", action="store_true")
    args = parser.parse_args(argv)
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    tokens = [2048] if args.check else args.tokens
    with tempfile.TemporaryDirectory(prefix="kvstore-bench-") as tmp:
        workdir = Path(tmp)
        model = build_tiny_llama(workdir / "model", BENCH_SPEC)
        sizes = [
            measure_size(model, workdir, n, args.repeats, with_disk=not args.check)
            for n in tokens
        ]
        throughput = None
        if not (args.check or args.no_throughput):
            throughput = measure_throughput(model, workdir, args.repeats)
    print(report(sizes, throughput))
    if args.json is not None:
        data = {"sizes": [s.__dict__ for s in sizes], "throughput": throughput}
        args.json.write_text(json.dumps(data, indent=2))
    if args.plot is not None:
        plot(sizes, args.plot)
    ok, message = gate(sizes[0])
    print(message)
    return 0 if ok or not args.check else 1


if __name__ == "__main__":
    sys.exit(main())
