"""Correctness oracles for a run with kvstore against the same prompts without it.

Three checks, each able to fail for the right reason (tests plant the faults):

1. **Load audit** (`AuditReport`): with `audit_loads` on, each loaded chunk is gathered back
   from the blocks the load job wrote and its xxh64 compared with the digest taken when the
   chunk was gathered for storing (`kvstore.transfer.audit`). It sees bytes changed between
   that gather and the load (a damaged CPU row or disk value, a row read for the wrong key); it
   cannot see wrong block ids in the jobs themselves, which check 2 does.
2. **KV against a reference engine** (`compare_kv`): the KV that loads put into the engine's
   cache, read from the blocks vLLM allocated for those tokens, is compared block by block with
   the KV an engine without kvstore (same model, dtype and block size) computed for the same
   tokens (`kvstore.vllm.kv_probe` reads both). A gather from the wrong blocks at store time or
   a scatter into the wrong blocks at load time puts another position's KV there.
   The two engines compute in differently composed batches, so equal KV is equal within float
   rounding: `kv_tolerance` says how much.
3. **Tokens, tie-aware** (`compare_greedy`): greedy outputs are compared token by token with a
   reference run. Batch composition (which changes when loads replace prefill work) changes
   rounding, and a random model has near-ties between its top two logits, so an honest run
   may pick the other token where the two are within rounding of each other. A divergence is
   accepted only where the reference's top-2 logprob gap is at most `tie_epsilon`, and the rest
   of that sequence is then not compared; a divergence at a clear margin is a failure, and so
   is a run where fewer than `MIN_EQUAL_RATIO` of the sequences were compared to their end
   (equal), whatever cut the others short.

A check that compared nothing does not pass: a run where loads were expected but none
happened is a failure, not a vacuous success.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

__all__ = [
    "DEFAULT_TIE_EPSILON",
    "MIN_EQUAL_RATIO",
    "AuditReport",
    "BlockKV",
    "BlockMismatch",
    "GreedyRun",
    "KVReport",
    "OutputsReport",
    "SequenceCheck",
    "Verdict",
    "compare_greedy",
    "compare_kv",
    "kv_tolerance",
]

DEFAULT_TIE_EPSILON = 1e-3
"""Largest top-2 logprob gap (nats) treated as a tie, for float32 models (the tiny model of the
demo and the tests): batch-composition noise there is ~1e-6, and 1e-3 still checks ~99.9% of
the demo's positions. A bf16 model needs a few rounding steps of its logits (~0.02)."""

MIN_EQUAL_RATIO = 0.9
"""Share of sequences that must be compared to their end (equal to the reference): a run with
more sequences cut at near-ties than this allows checked too little of its output to pass."""


@dataclass(frozen=True, slots=True)
class GreedyRun:
    """One greedy sequence: its tokens and, per position, logprob(top1) - logprob(top2)."""

    token_ids: tuple[int, ...]
    top2_gaps: tuple[float, ...]

    def __post_init__(self) -> None:
        if len(self.token_ids) != len(self.top2_gaps):
            raise ValueError(
                f"{len(self.token_ids)} tokens but {len(self.top2_gaps)} top-2 gaps; "
                "generate with logprobs >= 2"
            )


class Verdict(StrEnum):
    EQUAL = "equal"
    CUT_AT_TIE = "cut_at_tie"  # diverged where the reference's top two were tied
    DIVERGED = "diverged"  # diverged at a clear margin: wrong KV, or a real bug


@dataclass(frozen=True, slots=True)
class SequenceCheck:
    index: int
    verdict: Verdict
    position: int | None = None  # first differing token
    gap: float | None = None  # the reference's top-2 gap there


@dataclass(frozen=True, slots=True)
class OutputsReport:
    checks: tuple[SequenceCheck, ...]
    tie_epsilon: float
    min_equal_ratio: float = MIN_EQUAL_RATIO

    def count(self, verdict: Verdict) -> int:
        return sum(1 for c in self.checks if c.verdict is verdict)

    @property
    def equal_ratio(self) -> float:
        """Share of the sequences compared to their end (0 when there were none)."""
        return self.count(Verdict.EQUAL) / len(self.checks) if self.checks else 0.0

    @property
    def is_ok(self) -> bool:
        return self.count(Verdict.DIVERGED) == 0 and self.equal_ratio >= self.min_equal_ratio

    @property
    def failures(self) -> tuple[SequenceCheck, ...]:
        return tuple(c for c in self.checks if c.verdict is Verdict.DIVERGED)

    def describe(self) -> str:
        n = len(self.checks)
        equal, cut = self.count(Verdict.EQUAL), self.count(Verdict.CUT_AT_TIE)
        text = (
            f"outputs compared to their end and equal to the run without kvstore for {equal} of "
            f"{n} sequences ({100 * self.equal_ratio:.1f}%"
        )
        if self.equal_ratio < self.min_equal_ratio:
            text += f", FEWER than the {100 * self.min_equal_ratio:.0f}% required"
        text += ")"
        if cut:
            text += f", {cut} cut at near-ties (top-2 logprob gap <= {self.tie_epsilon:g})"
        for failure in self.failures:
            where = "in length" if failure.gap is None else f"(top-2 gap {failure.gap:.4f})"
            text += f"; sequence {failure.index} DIVERGED at token {failure.position} {where}"
        return text


def compare_greedy(
    reference: Sequence[GreedyRun],
    candidate: Sequence[GreedyRun],
    *,
    tie_epsilon: float = DEFAULT_TIE_EPSILON,
    min_equal_ratio: float = MIN_EQUAL_RATIO,
) -> OutputsReport:
    """Compare greedy sequences pairwise (module docstring)."""
    if len(reference) != len(candidate):
        raise ValueError(f"{len(reference)} reference sequences but {len(candidate)} candidates")
    if tie_epsilon < 0:
        raise ValueError(f"tie_epsilon must be >= 0, got {tie_epsilon}")
    checks = [
        _check(index, ref, cand, tie_epsilon)
        for index, (ref, cand) in enumerate(zip(reference, candidate, strict=True))
    ]
    return OutputsReport(tuple(checks), tie_epsilon, min_equal_ratio)


def _check(index: int, ref: GreedyRun, cand: GreedyRun, tie_epsilon: float) -> SequenceCheck:
    for position, (a, b) in enumerate(zip(ref.token_ids, cand.token_ids, strict=False)):
        if a != b:
            gap = ref.top2_gaps[position]
            verdict = Verdict.CUT_AT_TIE if gap <= tie_epsilon else Verdict.DIVERGED
            return SequenceCheck(index, verdict, position, gap)
    if len(ref.token_ids) != len(cand.token_ids):
        position = min(len(ref.token_ids), len(cand.token_ids))
        return SequenceCheck(index, Verdict.DIVERGED, position, None)
    return SequenceCheck(index, Verdict.EQUAL)


@dataclass(frozen=True, slots=True)
class AuditReport:
    """What the load audit found (`kvstore_load_audit_chunks_total` by result)."""

    verified: int
    mismatched: int
    unknown: int

    @classmethod
    def from_counts(cls, counts: Mapping[str, float]) -> AuditReport:
        return cls(
            verified=int(counts.get("verified", 0)),
            mismatched=int(counts.get("mismatched", 0)),
            unknown=int(counts.get("unknown", 0)),
        )

    @property
    def is_ok(self) -> bool:
        """Loaded chunks were audited and none differed (a run that audited nothing fails:
        where no load is expected, do not ask)."""
        return self.mismatched == 0 and self.verified > 0

    def describe(self) -> str:
        if self.mismatched:
            return (
                f"KV of {self.mismatched} loaded chunk(s) DIFFERED from what the engine stored "
                f"({self.verified} identical); they were reported as load errors and recomputed"
            )
        if not self.verified:
            return "NO loaded chunk was audited (nothing was loaded)"
        text = f"KV of {self.verified} loaded chunks byte-identical to what the engine stored"
        if self.unknown:
            text += f" ({self.unknown} stored by an earlier process, not audited)"
        return text


@dataclass(frozen=True, slots=True)
class BlockKV:
    """One engine block's KV, per layer, copied out of an engine's cache (`kvstore.vllm.kv_probe`);
    `block_hash`: vLLM's prefix-cache hash of the block."""

    block_hash: bytes
    layers: tuple[torch.Tensor, ...]


@dataclass(frozen=True, slots=True)
class BlockMismatch:
    block_hash: bytes
    layer: int
    error: float  # max |loaded - reference| / max |reference|, in that layer of the block


@dataclass(frozen=True, slots=True)
class KVReport:
    """Loaded blocks against the reference engine's (`compare_kv`)."""

    num_loaded: int
    num_compared: int
    num_unreferenced: int  # loaded blocks the reference never computed: not vouched for
    mismatches: tuple[BlockMismatch, ...]
    max_error: float  # the largest error of any compared block
    tolerance: float

    @property
    def is_ok(self) -> bool:
        """Something was compared, everything was, and nothing differed."""
        return self.num_compared > 0 and not self.num_unreferenced and not self.mismatches

    def describe(self) -> str:
        if not self.num_loaded:
            return "no block was loaded: the KV oracle had nothing to compare"
        text = (
            f"KV of {self.num_compared - len(self.mismatches)} of {self.num_loaded} loaded "
            f"blocks equal to the reference engine's (largest error {self.max_error:.1e}, "
            f"tolerance {self.tolerance:g})"
        )
        if self.num_unreferenced:
            text += f"; {self.num_unreferenced} never computed by the reference, NOT COMPARED"
        if self.mismatches:
            worst = max(self.mismatches, key=lambda m: m.error)
            text += (
                f"; {len(self.mismatches)} DIFFERED (worst: block {worst.block_hash[:6].hex()} "
                f"layer {worst.layer}, error {worst.error:.3f})"
            )
        return text


def compare_kv(
    reference: Mapping[bytes, BlockKV],
    loaded: Sequence[BlockKV],
    *,
    tolerance: float | None = None,
) -> KVReport:
    """Compare each loaded block with the reference's block of the same hash, layer by layer:
    the error is the largest elementwise difference over the largest reference magnitude in
    that layer of the block. `tolerance`: default `kv_tolerance` of the KV's dtype."""
    if tolerance is None:
        tolerance = kv_tolerance(loaded[0].layers[0].dtype) if loaded else 0.0
    mismatches = []
    num_compared = num_unreferenced = 0
    max_error = 0.0
    for block in loaded:
        expected = reference.get(block.block_hash)
        if expected is None:
            num_unreferenced += 1
            continue
        errors = [_error(got, want) for got, want in zip(block.layers, expected.layers,
                                                         strict=True)]  # fmt: skip
        num_compared += 1
        max_error = max(max_error, *errors)
        layer = max(range(len(errors)), key=errors.__getitem__)
        if errors[layer] > tolerance:
            mismatches.append(BlockMismatch(block.block_hash, layer, errors[layer]))
    return KVReport(
        num_loaded=len(loaded),
        num_compared=num_compared,
        num_unreferenced=num_unreferenced,
        mismatches=tuple(mismatches),
        max_error=max_error,
        tolerance=tolerance,
    )


def _error(got: torch.Tensor, want: torch.Tensor) -> float:
    if got.shape != want.shape:
        return float("inf")
    want = want.float()
    scale = float(want.abs().max())
    return float((got.float() - want).abs().max()) / max(scale, 1e-30)


def kv_tolerance(dtype: torch.dtype) -> float:
    """Largest `compare_kv` error (max |loaded - reference| / max |reference| in one layer of
    one block) that still counts as equal KV.

    The reference engine computes the same tokens in differently composed batches, so its KV is
    equal to the loaded KV only up to float rounding; a wrong block holds another position's KV,
    which differs by the values' own magnitude. Measured on the tiny model (CPU engine, sha256
    block hashes): healthy runs, float32, at most 3.9e-7 (the demo's 169 loaded blocks) and
    2.8e-7 (83 blocks of 10 prompts loaded in another batch order than computed); in bfloat16
    0.0 on the latter. Blocks of the wrong position: at least 1.23 (249 pairs, either dtype).
    float32: 1e-3 sits over 2,500x above the healthy error and over 1,000x below a wrong
    block's. 16-bit floats: one rounding step is 2^-8 (0.4%) of a value, and rounding in one
    layer feeds the next; 5e-2 allows a dozen steps at the block's largest value, still 20x
    below a wrong block's error."""
    import torch

    return 1e-3 if dtype == torch.float32 else 5e-2
