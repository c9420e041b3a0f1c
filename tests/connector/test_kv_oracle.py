"""The reference-KV oracle sees wrong blocks that the load audit cannot.

A chunk gathered from the wrong blocks at store time, or scattered into the wrong blocks at load
time, is self-consistent for the audit (its digest is taken over what the store gathered, and it
regathers from the blocks the load wrote). The KV oracle reads the blocks vLLM allocated for the
loaded tokens and compares them with an engine without kvstore: it fails on both faults, and
passes on the same run without them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from kvstore.oracle import BlockKV, compare_kv
from kvstore.tiny_model import TinyLlamaSpec
from kvstore.vllm.engine import engine, generate_runs, kv_transfer_config
from kvstore.vllm.kv_probe import computed_kv, loaded_kv
from tests.support.connector import drain, kvstore_summary
from tests.support.faults import plant_wrong_block_ids
from tests.support.oracle import assert_audited, assert_kv_equal

pytestmark = pytest.mark.engine

CHUNK_BYTES = TinyLlamaSpec().kv_bytes_per_token * 32  # one 32-token block, every layer
PROMPT = [(7 * i + 3) % 500 + 5 for i in range(200)]  # 6 full chunks before the last token


@pytest.fixture(scope="module")
def reference_kv(tiny_model_dir: Path) -> dict[bytes, BlockKV]:
    with engine(tiny_model_dir) as llm, computed_kv(llm) as computed:
        generate_runs(llm, [PROMPT])
    return computed.blocks


def _store_then_load(llm: Any, monkeypatch: pytest.MonkeyPatch, fault: str | None) -> Any:
    if fault == "store":
        plant_wrong_block_ids(monkeypatch, fault)
    generate_runs(llm, [PROMPT])
    drain(llm)
    assert llm.reset_prefix_cache()  # only kvstore has the prompt now
    if fault == "load":
        plant_wrong_block_ids(monkeypatch, fault)
    with loaded_kv(llm) as loaded:
        generate_runs(llm, [PROMPT])
    drain(llm)
    return loaded


@pytest.mark.parametrize("fault", [None, "store", "load"])
def test_kv_oracle_catches_wrong_block_ids(
    tiny_model_dir: Path,
    reference_kv: dict[bytes, BlockKV],
    monkeypatch: pytest.MonkeyPatch,
    fault: str | None,
) -> None:
    config = kv_transfer_config(cpu_bytes=64 * CHUNK_BYTES, audit_loads=True)
    with engine(tiny_model_dir, kv_transfer=config) as llm:
        loaded = _store_then_load(llm, monkeypatch, fault)
        summary = kvstore_summary(llm)
    assert loaded.counts.num_blocks == 6
    # The audit passes either way: both faults are consistent with the digests it keeps.
    assert_audited(summary, verified=6)
    if fault is None:
        report = assert_kv_equal(reference_kv, loaded, num_blocks=6)
        assert report.max_error < report.tolerance / 100, report.describe()
        return
    report = compare_kv(reference_kv, loaded.blocks)
    assert len(report.mismatches) == 6, report.describe()  # every chunk took its neighbour's
    assert min(m.error for m in report.mismatches) > 100 * report.tolerance, report.describe()
    with pytest.raises(AssertionError, match="DIFFERED"):
        assert_kv_equal(reference_kv, loaded)
