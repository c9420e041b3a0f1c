"""The oracles of `kvstore.oracle` and the load probe's bookkeeping, without an engine."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
import torch

from kvstore.oracle import (
    AuditReport,
    BlockKV,
    GreedyRun,
    Verdict,
    compare_greedy,
    compare_kv,
    kv_tolerance,
)
from kvstore.vllm.kv_probe import LoadProbe

# -- tokens ----------------------------------------------------------------------------------


def _runs(n: int) -> list[GreedyRun]:
    return [GreedyRun((1, 2, 3), (1.0, 1e-5, 1.0)) for _ in range(n)]


def _cut(run: GreedyRun) -> GreedyRun:
    """Diverges at position 1, where the reference's top two tie."""
    return GreedyRun((1, 9, 9), run.top2_gaps)


def test_a_run_with_90_percent_compared_to_the_end_passes() -> None:
    reference = _runs(10)
    report = compare_greedy(reference, [_cut(reference[0]), *reference[1:]])
    assert report.is_ok
    assert report.count(Verdict.CUT_AT_TIE) == 1
    assert report.equal_ratio == pytest.approx(0.9)
    assert "9 of 10 sequences (90.0%)" in report.describe()


def test_fewer_than_90_percent_compared_to_the_end_fails_though_nothing_diverged() -> None:
    reference = _runs(10)
    report = compare_greedy(reference, [_cut(r) for r in reference[:2]] + reference[2:])
    assert report.count(Verdict.DIVERGED) == 0
    assert not report.is_ok
    assert "8 of 10 sequences (80.0%, FEWER than the 90% required)" in report.describe()


def test_a_clear_divergence_fails_and_nothing_compared_fails() -> None:
    reference = [GreedyRun((1, 2), (1.0, 1.0))]
    assert not compare_greedy(reference, [GreedyRun((1, 3), (1.0, 1.0))]).is_ok
    assert not compare_greedy([], []).is_ok


# -- the load audit ---------------------------------------------------------------------------


def test_an_audit_that_verified_nothing_fails() -> None:
    assert not AuditReport(verified=0, mismatched=0, unknown=0).is_ok
    assert "NO loaded chunk" in AuditReport(0, 0, 0).describe()
    assert not AuditReport(verified=0, mismatched=0, unknown=3).is_ok
    assert AuditReport(verified=5, mismatched=0, unknown=0).is_ok
    assert not AuditReport(verified=5, mismatched=1, unknown=0).is_ok


# -- KV against the reference -----------------------------------------------------------------


def _block(seed: int, name: bytes, noise: float = 0.0) -> BlockKV:
    generator = torch.Generator().manual_seed(seed)
    layers = tuple(torch.randn(2, 32, 64, generator=generator) for _ in range(2))
    return BlockKV(name, tuple(t * (1 + noise) for t in layers))


def test_kv_equal_within_rounding_passes() -> None:
    reference = {b"a": _block(1, b"a"), b"b": _block(2, b"b")}
    loaded = [_block(1, b"a", noise=1e-6), _block(2, b"b")]
    report = compare_kv(reference, loaded)
    assert report.is_ok, report.describe()
    assert report.num_compared == 2
    assert 0 < report.max_error < 1e-5
    assert report.tolerance == kv_tolerance(torch.float32)


def test_kv_of_another_block_fails() -> None:
    reference = {b"a": _block(1, b"a"), b"b": _block(2, b"b")}
    swapped = [BlockKV(b"a", _block(2, b"b").layers), BlockKV(b"b", _block(1, b"a").layers)]
    report = compare_kv(reference, swapped)
    assert not report.is_ok
    assert len(report.mismatches) == 2
    assert min(m.error for m in report.mismatches) > 0.5
    assert "2 DIFFERED" in report.describe()


def test_one_wrong_layer_fails() -> None:
    good = _block(1, b"a")
    wrong = BlockKV(b"a", (good.layers[0], _block(3, b"x").layers[1]))
    (mismatch,) = compare_kv({b"a": good}, [wrong]).mismatches
    assert mismatch.layer == 1


def test_kv_with_nothing_to_compare_fails() -> None:
    assert not compare_kv({}, []).is_ok
    assert "nothing to compare" in compare_kv({}, []).describe()
    report = compare_kv({}, [_block(1, b"a")])  # the reference never computed it
    assert not report.is_ok
    assert report.num_unreferenced == 1
    assert "NOT COMPARED" in report.describe()


# -- the load probe's bookkeeping -------------------------------------------------------------


@dataclass
class _Request:
    request_id: str
    num_blocks: int
    num_computed_tokens: int = 0
    num_preemptions: int = 0
    is_done: bool = False

    @property
    def block_hashes(self) -> list[bytes]:
        return [f"{self.request_id}-{i}".encode() for i in range(self.num_blocks)]

    def is_finished(self) -> bool:
        return self.is_done


@dataclass
class _Blocks:
    ids: list[int]

    def get_block_ids(self) -> tuple[list[int]]:
        return (self.ids,)


@dataclass
class _Scheduler:
    finished_recving_kv_req_ids: set[str] = field(default_factory=set)


@dataclass
class _Cache:
    block_size: int = 32
    scheduler: _Scheduler = field(default_factory=_Scheduler)
    reads: list[int] = field(default_factory=list)
    num_groups: int = 1

    def read(self, block_id: int, group: int = 0) -> tuple[torch.Tensor, ...]:
        self.reads.append(block_id)
        return (torch.full((2,), float(block_id)),)

    def name(self, block_hash: bytes, group: int) -> bytes:
        return block_hash


def _load(probe: LoadProbe, cache: Any, request: _Request, local: int, external: int,
          is_async: bool) -> None:  # fmt: skip
    probe.on_lookup(request, local, (external, is_async))
    probe.on_alloc(cache, request, _Blocks(list(range(100, 100 + request.num_blocks))), external)


def test_probe_reads_a_sync_load_after_its_step_from_vllms_blocks() -> None:
    probe, cache = LoadProbe(), _Cache()
    request = _Request("r", num_blocks=8)
    _load(probe, cache, request, local=64, external=128, is_async=False)  # blocks 2..5
    request.num_computed_tokens = 200
    probe.after_step(cache)  # type: ignore[arg-type]
    assert cache.reads == [102, 103, 104, 105]
    assert [b.block_hash for b in probe.blocks] == [b"r-2", b"r-3", b"r-4", b"r-5"]
    assert probe.counts.num_blocks == 4 and probe.counts.num_async_loads == 0


def test_probe_waits_for_an_async_load_and_skips_what_vllm_recomputes() -> None:
    probe, cache = LoadProbe(), _Cache()
    request = _Request("r", num_blocks=8, num_preemptions=1)
    _load(probe, cache, request, local=0, external=192, is_async=True)
    request.num_computed_tokens = 192
    probe.after_step(cache)  # type: ignore[arg-type]
    probe.after_step(cache)  # type: ignore[arg-type]
    assert probe.blocks == [] and probe.num_pending == 1
    request.num_computed_tokens = 96  # blocks 3.. failed: vLLM recomputes them
    cache.scheduler.finished_recving_kv_req_ids.add("r")
    probe.after_step(cache)  # type: ignore[arg-type]
    assert cache.reads == [100, 101, 102]
    assert probe.counts.num_failed_blocks == 3
    assert probe.async_load_steps == [3]
    assert probe.num_preempted_loads == 1


def test_probe_drops_a_load_whose_request_was_aborted() -> None:
    probe, cache = LoadProbe(), _Cache()
    request = _Request("r", num_blocks=8)
    _load(probe, cache, request, local=0, external=192, is_async=True)
    request.is_done = True
    probe.after_step(cache)  # type: ignore[arg-type]
    assert cache.reads == [] and probe.num_pending == 0
    assert probe.counts.num_aborted_blocks == 6
