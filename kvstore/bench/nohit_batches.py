"""The no-hit batches of `kvstore bench connector`: unique prompts (no hits) timed on the
engine without kvstore and with it, interleaved, and their paired throughput ratios."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, replace

from kvstore.bench.engines import BenchEngine, synthetic_prompt

__all__ = ["NohitBatches", "measure_nohit", "nohit_ratio", "paired_ratios"]

# --check: the prefill batch's target length. Pairs of a few seconds each keep the gate's
# ratio steady (a batch of 0.08 s swung by 0.15); more prompts per batch only cost CI time.
_CHECK_BATCH_S = 2.0


@dataclass(frozen=True)
class NohitBatches:
    """The no-hit batches timed on the same two engines before the hits: `prompts` unique
    prompts of `tokens` tokens, with 1 output token (prefill-heavy) and `decode_tokens`.
    The defaults fit the engine cache of a 2048-token size (4096 tokens) and take about 1 s
    and 2 s on 2 cores: shorter batches (2 prompts of 256 tokens, 16 output tokens: 0.08 s and
    0.25 s) gave ratios that swung by 0.15 between runs."""

    prompts: int = 6
    tokens: int = 512
    decode_tokens: int = 64

    @property
    def num_tokens(self) -> int:
        return self.prompts * self.tokens

    def fitted(self, prefill_s: float, prefill_tokens: int) -> NohitBatches:
        """The batches with as many prompts (at least 1, at most these) as one engine
        prefills in about `_CHECK_BATCH_S`, from a warm engine's prefill of `prefill_tokens`
        in `prefill_s`. On a 2-vCPU AMX VM 6 prompts take ~1 s: unchanged. On a 2-vCPU EPYC
        without AVX-512 (a 2048-token prefill in ~17 s multiprocess) one prompt takes ~4 s:
        the whole gate took 9.8 min there with 2 prompts a batch, ~25 min with 6."""
        per_prompt_s = prefill_s * self.tokens / prefill_tokens
        prompts = max(1, min(self.prompts, round(_CHECK_BATCH_S / max(per_prompt_s, 1e-6))))
        return replace(self, prompts=prompts)


def measure_nohit(
    off: BenchEngine, on: BenchEngine, repeats: int, batches: NohitBatches
) -> dict[str, dict[str, list[float]]]:
    """Seconds per batch of unique prompts (no hits) on the engine without kvstore and with
    it, interleaved; after each of kvstore's batches its disk writes settle, untimed."""
    times: dict[str, dict[str, list[float]]] = {"prefill": {}, "decode": {}}
    before = sum(on.hit_tokens())
    kinds = (("prefill", 1), ("decode", batches.decode_tokens))
    for engine in (off, on):  # untimed: the first batch of a new shape builds CPU kernels
        for b, (_, max_tokens) in enumerate(kinds):
            seeds = range(40_000 + 100 * b, 40_000 + 100 * b + batches.prompts)
            engine.batch_s([synthetic_prompt(s, batches.tokens) for s in seeds], max_tokens)
    on.wait_settled()
    for r in range(repeats):
        order = [("off", off), ("on", on)] if r % 2 == 0 else [("on", on), ("off", off)]
        for b, (batch, max_tokens) in enumerate(kinds):
            for e, (name, engine) in enumerate(order):
                seed = 50_000 + 1000 * r + 100 * b + 10 * e
                n = batches.prompts
                prompts = [synthetic_prompt(seed + i, batches.tokens) for i in range(n)]
                times[batch].setdefault(name, []).append(engine.batch_s(prompts, max_tokens))
                if engine is on:
                    on.wait_settled()
    if sum(on.hit_tokens()) > before:
        raise RuntimeError("the no-hit batches hit kvstore's tiers")
    return times


def paired_ratios(times: dict[str, list[float]]) -> list[float]:
    return [off / on for off, on in zip(times["off"], times["on"], strict=True)]


def nohit_ratio(times: dict[str, list[float]]) -> float:
    """Throughput with kvstore on, relative to off: the median over repeats of seconds off /
    seconds on. A repeat times both engines back to back, so the pair shares the machine's
    state at that moment (on 2 idle cores one engine's batch times ranged over 1.6x within a
    run, and medians of each side alone moved by 0.1 between runs)."""
    return statistics.median(paired_ratios(times))
