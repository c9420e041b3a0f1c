"""`kvstore bench hybrid`: bytes per prompt and hit time, hybrid manager on vs off."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvstore.bench.hybrid import HybridResult, main, report


def test_the_report_compares_each_setting_with_the_manager_off() -> None:
    on = HybridResult("on", {"recompute": [1.0], "floor": [0.1], "kvstore_cpu": [0.15]}, [3 << 20])
    off = HybridResult("off", {"recompute": [1.2], "floor": [0.1], "kvstore_cpu": [0.2]}, [6 << 20])
    text = report([on, off], 2048, 512)
    assert "| on | 3.00 MiB | 0.50 | 1.000 | 0.100 | 0.150 | 1.50 | 0.15 |" in text
    assert "| off | 6.00 MiB | 1.00 | 1.200 | 0.100 | 0.200 | 2.00 | 0.17 |" in text
    assert "5 sliding-window layers of 512 tokens + 1 full, prompt 2048 tokens" in text


def test_a_prompt_must_reach_past_the_window() -> None:
    with pytest.raises(SystemExit):
        main(["--tokens", "512", "--window", "512"])


@pytest.mark.engine
def test_the_hybrid_manager_stores_fewer_bytes_per_prompt(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # what `main` sets for its own process, restored for the tests after this one
    monkeypatch.setenv("VLLM_CPU_NUM_OF_RESERVED_CPU", "1")
    monkeypatch.setenv("VLLM_LOGGING_LEVEL", "WARNING")
    out = tmp_path / "hybrid.json"
    assert main(["--tokens", "320", "--repeats", "1", "--window", "64", "--json", str(out)]) == 0
    results = {r["manager"]: r for r in json.loads(out.read_text())}
    chunk = 32 * 2 * 8 * 64 * 2  # one layer's chunk: tokens x (K, V) x heads x head dim x bf16
    # 320 tokens: 10 chunks; the full layer stores all, each sliding-window layer the 2 before
    # the prompt's last token (boundary 9: chunks 7-8) and, as the request ends with all 320
    # computed, chunk 9 (boundary 10, a next turn's); the next retained one (1024) is past it
    assert results["on"]["stored_bytes"] == [(10 + 5 * 3) * chunk]
    assert results["off"]["stored_bytes"] == [10 * 6 * chunk]
    assert "| on |" in capsys.readouterr().out
