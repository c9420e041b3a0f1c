"""`kvstore demo`'s terminal, without an engine: a stand-in `run_demo` makes the noise vLLM and
torch make (C++ writes to descriptors 1 and 2, the `vllm` logger, a FutureWarning) and then
fails or returns a result. Run as a subprocess, like `make demo`: real descriptors, not a TTY.
(`test_demo_engine.py` runs the real engine once.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

_STAND_IN = textwrap.dedent(
    """
    import logging, os, sys, types, warnings
    from dataclasses import dataclass
    from pathlib import Path

    @dataclass(frozen=True)
    class TurnStats:
        turn: int
        num_requests: int
        prompt_tokens: int
        engine_cache_tokens: int
        cpu_tokens: int
        disk_tokens: int

        @property
        def computed_tokens(self):
            served = self.engine_cache_tokens + self.cpu_tokens + self.disk_tokens
            return self.prompt_tokens - served

    def noise():
        os.write(2, b"[W1203 10:07:44.881591438 utils.cpp:68] Warning: NUMA binding (C++)\\n")
        os.write(1, b"printf from C onto stdout\\n")
        print("Loading safetensors checkpoint shards: 100% 1/1", file=sys.stderr)
        logging.getLogger("vllm.stand_in").warning("WARNING from vLLM's logger")
        warnings.warn("reduce_op is deprecated", FutureWarning, stacklevel=1)

    def run_demo(options, on_progress, on_turn=None, after_turn=None):
        on_progress("kvstore: the stand-in workload")
        noise()
        logging.getLogger("kvstore.stand_in").warning("kvstore's own warning")
        if os.environ.get("STAND_IN_FAIL"):
            raise RuntimeError("the engine exploded")
        turns = [TurnStats(t, 2, 600 * (t + 1), 300 * t, 100 * t, 32 * t) for t in range(2)]
        for stats in turns:
            on_turn(stats)
        return types.SimpleNamespace(
            store_path=options.store_path, metrics_url=None, turns=turns, num_requests=4,
            prompt_tokens=1800, kvstore_hit_tokens=132, engine_hit_tokens=300,
            prefill_tokens=1368, baseline_prefill_tokens=None, elapsed_s=1.0,
            baseline_elapsed_s=None, is_correct=True, audit=None, kv=None, outputs=None,
            loads=types.SimpleNamespace(
                num_loads=0, num_blocks=0, num_failed_blocks=0, num_aborted_blocks=0,
            ),
            expects_loads=False, summary={"tiers": {}, "bytes": {}},
        )

    module = types.ModuleType("kvstore.demo.runner")
    module.run_demo = run_demo
    sys.modules["kvstore.demo.runner"] = module
    from kvstore.cli import app
    app(sys.argv[1:], prog_name="kvstore")
    """
)


def _demo(tmp_path: Path, *args: str, fail: bool = False) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "stand_in.py"
    script.write_text(_STAND_IN)
    env = {**os.environ, "STAND_IN_FAIL": "1" if fail else ""}
    return subprocess.run(
        [sys.executable, str(script), "demo", "--dir", str(tmp_path / "demo"),
         "--turns", "2", "--conversations", "2", "--no-baseline", *args],
        capture_output=True, text=True, timeout=600, env=env, check=False,
    )  # fmt: skip


def _assert_no_engine_noise(text: str) -> None:
    for noise in ("Traceback", "WARNING", "Warning", "[W1203", "printf from C", "safetensors"):
        assert noise not in text, text


def test_a_failure_is_one_red_line_naming_the_log(tmp_path: Path) -> None:
    result = _demo(tmp_path, fail=True)

    log = tmp_path / "demo" / "vllm.log"
    assert result.returncode == 1
    assert result.stdout == ""
    _assert_no_engine_noise(result.stdout + result.stderr)
    (error,) = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert error == (
        f"error: kvstore demo failed: RuntimeError: the engine exploded (details in {log})"
    )
    assert "warning: kvstore's own warning" in result.stderr
    logged = log.read_text()
    for line in ("Traceback", "RuntimeError: the engine exploded", "[W1203", "printf from C",
                 "Loading safetensors", "WARNING from vLLM's logger", "FutureWarning"):  # fmt: skip
        assert line in logged


def test_verbose_shows_the_engine_output_and_the_traceback(tmp_path: Path) -> None:
    result = _demo(tmp_path, "-v", fail=True)

    assert result.returncode == 1
    assert result.stdout == ""  # descriptor 1 joined stderr
    for line in ("Traceback", "[W1203", "printf from C", "WARNING from vLLM's logger"):
        assert line in result.stderr
    assert "error: kvstore demo failed: RuntimeError: the engine exploded" in result.stderr
    assert not (tmp_path / "demo" / "vllm.log").exists()


def test_a_run_reports_progress_picture_and_next_steps(tmp_path: Path) -> None:
    result = _demo(tmp_path)

    directory = tmp_path / "demo"
    assert result.returncode == 0, result.stderr
    _assert_no_engine_noise(result.stdout + result.stderr)
    assert "4/4 requests, turn 2/2" in result.stderr
    assert "tokens: engine cache 300 · kvstore CPU 100 · disk 32 · computed 1,368" in (
        result.stderr
    )
    assert f"vLLM's own output: {directory / 'vllm.log'}" in result.stdout
    assert f"kvstore stat {directory / 'store'}" in result.stdout
    assert "kvstore bench connector" in result.stdout
    pytest.importorskip("matplotlib")
    assert f"picture: {directory / 'demo.png'}" in result.stdout
    assert (directory / "demo.png").read_bytes().startswith(b"\x89PNG")


def test_json_keeps_stdout_to_one_document(tmp_path: Path) -> None:
    result = _demo(tmp_path, "--json")

    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    assert document["log_path"] == str(tmp_path / "demo" / "vllm.log")
    assert document["num_requests"] == 4
    assert [turn["computed_tokens"] for turn in document["turns"]] == [600, 768]
    assert document["oracle"] == "kvstore loaded nothing"
    assert document["kv"]["loaded_blocks"] == 0


def test_a_directory_that_cannot_be_made_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "demo").write_text("a file, not a directory")

    result = _demo(tmp_path)

    assert result.returncode == 1
    assert result.stderr.startswith("error: --dir ")
    assert "Traceback" not in result.stderr
