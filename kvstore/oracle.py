"""Correctness oracles for a run with kvstore against the same prompts without it.

Two checks, each deterministic and each able to fail for the right reason:

1. **KV bytes** (`AuditReport`): with `audit_loads` on, every chunk kvstore loads is compared,
   byte for byte (xxh64), with what the engine computed when the chunk was stored
   (`kvstore.transfer.audit`). This is the invariant kvstore promises; it does not depend on
   scheduling or on the model's numerics.
2. **Tokens, tie-aware** (`compare_greedy`): greedy outputs are compared token by token with a
   reference run. Batch composition (which changes when loads replace prefill work) changes
   bf16 rounding, and a random model has near-ties between its top two logits, so an honest run
   may pick the other token where the two are within rounding of each other. A divergence is
   accepted only where the reference's top-2 logprob gap is at most `tie_epsilon` (the rest of
   that sequence is not compared); a divergence at a clear margin is a failure.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum

__all__ = [
    "DEFAULT_TIE_EPSILON",
    "AuditReport",
    "GreedyRun",
    "OutputsReport",
    "SequenceCheck",
    "Verdict",
    "compare_greedy",
]

DEFAULT_TIE_EPSILON = 1e-3
"""Largest top-2 logprob gap (nats) treated as a tie, for float32 models (the tiny model of the
demo and the tests): batch-composition noise there is ~1e-6, and 1e-3 still checks ~99.9% of
the demo's positions. A bf16 model needs a few rounding steps of its logits (~0.02)."""


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

    def count(self, verdict: Verdict) -> int:
        return sum(1 for c in self.checks if c.verdict is verdict)

    @property
    def is_ok(self) -> bool:
        return self.count(Verdict.DIVERGED) == 0

    @property
    def failures(self) -> tuple[SequenceCheck, ...]:
        return tuple(c for c in self.checks if c.verdict is Verdict.DIVERGED)

    def describe(self) -> str:
        n = len(self.checks)
        equal, cut = self.count(Verdict.EQUAL), self.count(Verdict.CUT_AT_TIE)
        text = f"outputs equal to the run without kvstore for {equal} of {n} sequences"
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
    return OutputsReport(checks=tuple(checks), tie_epsilon=tie_epsilon)


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
        return self.mismatched == 0

    def describe(self) -> str:
        if self.mismatched:
            return (
                f"KV of {self.mismatched} loaded chunk(s) DIFFERED from what the engine stored "
                f"({self.verified} identical); they were reported as load errors and recomputed"
            )
        text = f"KV of {self.verified} loaded chunks byte-identical to what the engine stored"
        if self.unknown:
            text += f" ({self.unknown} stored by an earlier process, not audited)"
        return text
