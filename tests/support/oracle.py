"""The correctness oracles of `kvstore.oracle`, as assertions for the real-engine tests.

Greedy tokens alone are not a sound oracle on a random model: a different batch composition
changes rounding and can flip a near-tied argmax. Tests compare tie-aware (and require at least
90% of the sequences compared to their end), check the load audit (loads happened, every loaded
chunk byte-identical to what the engine stored), and compare the KV that loads put into the
engine with the KV a reference engine without kvstore computed for the same tokens.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from kvstore.oracle import (
    DEFAULT_TIE_EPSILON,
    AuditReport,
    BlockKV,
    GreedyRun,
    KVReport,
    OutputsReport,
    Verdict,
    compare_greedy,
    compare_kv,
)
from kvstore.vllm.kv_probe import LoadProbe

__all__ = ["assert_audited", "assert_kv_equal", "assert_same_outputs", "runs_from"]


def assert_same_outputs(
    reference: Sequence[GreedyRun],
    candidate: Sequence[GreedyRun],
    *,
    tie_epsilon: float = DEFAULT_TIE_EPSILON,
    num_equal: int | None = None,
) -> OutputsReport:
    """Fail unless every sequence is equal or diverges only at a near-tie of the reference,
    and at least 90% are equal to their end; `num_equal`: exactly that many are."""
    report = compare_greedy(reference, candidate, tie_epsilon=tie_epsilon)
    assert report.is_ok, report.describe()
    if num_equal is not None:
        assert report.count(Verdict.EQUAL) == num_equal, report.describe()
    return report


def assert_audited(summary: Mapping[str, Any], *, verified: int | None = None) -> AuditReport:
    """Fail unless loaded chunks were audited and none differed from what was stored;
    `verified`: exact count."""
    audit = AuditReport.from_counts(summary.get("load_audit", {}))
    assert audit.is_ok, audit.describe()
    if verified is not None:
        assert audit.verified == verified, audit.describe()
    return audit


def assert_kv_equal(
    reference: Mapping[bytes, BlockKV], loaded: LoadProbe, *, num_blocks: int | None = None
) -> KVReport:
    """Fail unless every block the loads filled (and vLLM kept) equals the reference's, and at
    least one was compared; `num_blocks`: exactly that many."""
    report = compare_kv(reference, loaded.blocks)
    assert report.is_ok, report.describe()
    if num_blocks is not None:
        assert report.num_compared == num_blocks, report.describe()
    return report


def runs_from(result: Mapping[str, Any], prefix: str = "") -> list[GreedyRun]:
    """GreedyRuns from a `tests.support.driver` result (`outputs`/`top2_gaps`, or the
    `repeat_` ones with `prefix="repeat_"`)."""
    return [
        GreedyRun(tuple(tokens), tuple(gaps))
        for tokens, gaps in zip(result[f"{prefix}outputs"], result[f"{prefix}top2_gaps"],
                                strict=True)
    ]  # fmt: skip
