"""The correctness oracles of `kvstore.oracle`, as assertions for the real-engine tests.

Greedy tokens alone are not a sound oracle on the tiny bf16 model: a different batch
composition changes rounding and can flip a near-tied argmax. Tests compare tie-aware, and
check the load audit (every loaded chunk byte-identical to what the engine stored).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from kvstore.oracle import (
    DEFAULT_TIE_EPSILON,
    AuditReport,
    GreedyRun,
    OutputsReport,
    compare_greedy,
)

__all__ = ["assert_audited", "assert_same_outputs", "runs_from"]


def assert_same_outputs(
    reference: Sequence[GreedyRun],
    candidate: Sequence[GreedyRun],
    *,
    tie_epsilon: float = DEFAULT_TIE_EPSILON,
) -> OutputsReport:
    """Fail unless every sequence is equal or diverges only at a near-tie of the reference."""
    report = compare_greedy(reference, candidate, tie_epsilon=tie_epsilon)
    assert report.is_ok, report.describe()
    return report


def assert_audited(summary: Mapping[str, Any], *, verified: int | None = None) -> AuditReport:
    """Fail if any loaded chunk differed from what was stored; `verified`: exact count."""
    audit = AuditReport.from_counts(summary.get("load_audit", {}))
    assert audit.is_ok, audit.describe()
    if verified is not None:
        assert audit.verified == verified, audit.describe()
    return audit


def runs_from(result: Mapping[str, Any], prefix: str = "") -> list[GreedyRun]:
    """GreedyRuns from a `tests.support.driver` result (`outputs`/`top2_gaps`, or the
    `repeat_` ones with `prefix="repeat_"`)."""
    return [
        GreedyRun(tuple(tokens), tuple(gaps))
        for tokens, gaps in zip(result[f"{prefix}outputs"], result[f"{prefix}top2_gaps"],
                                strict=True)
    ]  # fmt: skip
