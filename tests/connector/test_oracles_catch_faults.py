"""The correctness oracles fail for the right reason: a planted fault is reported.

- A CPU row damaged after its chunk was stored: the load audit counts a mismatch, reports the
  load failed (vLLM recomputes, so no wrong token is served) and the tests' helper fails.
- Rows swapped between two prompts with the audit off: wrong but valid KV reaches the engine,
  and the tie-aware token comparison reports a divergence at a clear margin.
- The demo, with rows damaged between turns, says its check FAILED; so does the demo whose
  stores gathered the wrong blocks (only its reference-KV check sees that), and the demo where
  loads were expected and none happened. The healthy demo passes all three checks, with loads.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from kvstore.demo.report import DemoFiles, report_data
from kvstore.demo.runner import DemoOptions, run_demo
from kvstore.keys import Tier
from kvstore.oracle import Verdict, compare_greedy
from kvstore.tiny_model import TinyLlamaSpec
from kvstore.vllm.engine import engine, generate_runs, kv_transfer_config, scheduler_connector
from tests.support.connector import drain, kvstore_summary
from tests.support.faults import damage_cpu_rows, plant_wrong_block_ids, swap_cpu_rows
from tests.support.oracle import assert_audited, assert_same_outputs

pytestmark = pytest.mark.engine

CHUNK_BYTES = TinyLlamaSpec().kv_bytes_per_token * 32  # one 32-token block, every layer
PROMPT_A = [(7 * i + 3) % 500 + 5 for i in range(200)]
PROMPT_B = [(11 * i + 1) % 500 + 5 for i in range(200)]


def test_audit_catches_a_damaged_row_and_the_load_is_recomputed(tiny_model_dir: Path) -> None:
    config = kv_transfer_config(cpu_bytes=64 * CHUNK_BYTES, audit_loads=True)
    with engine(tiny_model_dir, kv_transfer=config) as llm:
        _, reference = generate_runs(llm, [PROMPT_A])
        drain(llm)
        runtime = scheduler_connector(llm).runtime
        assert damage_cpu_rows(runtime, 2) == 2
        assert llm.reset_prefix_cache()
        _, again = generate_runs(llm, [PROMPT_A])
        drain(llm)
        summary = kvstore_summary(llm)
    with pytest.raises(AssertionError, match="DIFFERED"):
        assert_audited(summary)
    assert summary["load_audit"]["mismatched"] == 2
    assert summary["load_failed_chunks"] >= 2  # reported to vLLM ...
    assert_same_outputs(reference, again)  # ... which recomputed: no wrong token served


def test_token_oracle_catches_wrong_kv_served_without_the_audit(tiny_model_dir: Path) -> None:
    config = kv_transfer_config(cpu_bytes=64 * CHUNK_BYTES)
    with engine(tiny_model_dir, kv_transfer=config) as llm:
        _, reference = generate_runs(llm, [PROMPT_A], max_tokens=16)
        drain(llm)
        runtime = scheduler_connector(llm).runtime
        keys_a = sorted(runtime.index.ready_keys(Tier.CPU))
        generate_runs(llm, [PROMPT_B])
        drain(llm)
        keys_b = sorted(runtime.index.ready_keys(Tier.CPU) - set(keys_a))
        assert len(keys_a) == len(keys_b) == 6
        swap_cpu_rows(runtime, keys_a, keys_b)
        assert llm.reset_prefix_cache()
        _, wrong = generate_runs(llm, [PROMPT_A], max_tokens=16)
    report = compare_greedy(reference, wrong)
    assert report.count(Verdict.DIVERGED) == 1, report.describe()
    with pytest.raises(AssertionError, match="DIVERGED"):
        assert_same_outputs(reference, wrong)


def test_demo_check_fails_when_loaded_rows_are_damaged(tmp_path: Path) -> None:
    def damage(turn: int, llm: Any) -> None:
        if turn == 2:  # the next turns load these conversations' prefixes from kvstore
            damage_cpu_rows(scheduler_connector(llm).runtime, 64)

    options = DemoOptions(directory=tmp_path, num_turns=5, metrics_port=None)
    result = run_demo(options, on_progress=lambda m: None, after_turn=damage)
    assert result.audit is not None and result.audit.mismatched > 0
    assert result.audit.verified > 0  # the undamaged rows still load and verify
    assert not result.is_correct
    assert "DIFFERED" in result.audit.describe()
    assert result.outputs is not None and result.outputs.is_ok  # recomputed, not served


def _demo(tmp_path: Path) -> Any:
    """Five turns of six conversations: turn 4 resends more history than the engine holds."""
    options = DemoOptions(directory=tmp_path, num_turns=5, metrics_port=None)
    return run_demo(options, on_progress=lambda m: None)


def test_healthy_demo_loads_and_passes_every_check(tmp_path: Path) -> None:
    result = _demo(tmp_path)
    assert result.expects_loads and result.loads.num_blocks > 0
    assert result.kv is not None and result.outputs is not None and result.audit is not None
    assert result.is_correct, report_data(result, DemoFiles(None, None))["oracle"]
    assert result.kv.num_compared == result.loads.num_blocks - result.loads.num_failed_blocks
    assert result.audit.verified >= result.kv.num_compared
    assert result.outputs.equal_ratio >= 0.9
    data = report_data(result, DemoFiles(None, None))
    assert data["outputs"]["equal"] == result.outputs.count(Verdict.EQUAL)
    assert f"({100 * result.outputs.equal_ratio:.1f}%" in data["oracle"]


def test_demo_fails_when_stores_gather_the_wrong_blocks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    plant_wrong_block_ids(monkeypatch, "store")
    result = _demo(tmp_path)
    assert result.audit is not None and result.audit.is_ok  # consistent with its digests
    assert result.kv is not None and result.kv.mismatches, result.kv
    assert not result.is_correct
    assert "DIFFERED" in report_data(result, DemoFiles(None, None))["oracle"]


def test_demo_fails_when_loads_were_expected_but_none_happened(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from kvstore.vllm.scheduler import ConnectorScheduler

    def never_hits(self: Any, request: Any, num_computed_tokens: int) -> tuple[int, bool]:
        return 0, False

    monkeypatch.setattr(ConnectorScheduler, "get_num_new_matched_tokens", never_hits)
    result = _demo(tmp_path)
    assert result.expects_loads and result.loads.num_blocks == 0
    assert result.outputs is not None and result.outputs.is_ok  # nothing wrong was served
    assert not result.is_correct
    assert "loads were EXPECTED" in report_data(result, DemoFiles(None, None))["oracle"]
