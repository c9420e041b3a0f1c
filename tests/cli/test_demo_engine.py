"""`kvstore demo` on the real engine, run the way `make demo` runs it: the `kvstore` script in a
subprocess, stdout and stderr captured (not a terminal). The terminal gets kvstore's lines only;
vLLM's and torch's output is in the log; the picture is written; the next steps are printed and
the store ones work as printed."""

from __future__ import annotations

import importlib.util
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from .helpers import run

pytestmark = pytest.mark.engine

_ENGINE_NOISE = re.compile(r"WARNING|Warning|Traceback|^\[W\d|it/s\]", re.MULTILINE)


def _kvstore_command() -> list[str]:
    script = Path(sys.executable).parent / "kvstore"  # what `make demo` runs
    if script.exists():
        return [str(script)]
    return [sys.executable, "-c", "from kvstore.cli import main; main()"]


def test_make_demo_shows_only_kvstore_lines(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_LOGGING")}
    demo = subprocess.run(
        [*_kvstore_command(), "demo", "--dir", str(tmp_path), "--turns", "2",
         "--conversations", "2"],
        capture_output=True, text=True, timeout=600, env=env, check=False,
    )  # fmt: skip

    terminal = demo.stdout + demo.stderr
    assert demo.returncode == 0, terminal[-4000:]
    assert _ENGINE_NOISE.search(terminal) is None, terminal
    assert "correctness (correct)" in demo.stdout
    assert "4/4 requests, turn 2/2" in demo.stderr
    log = (tmp_path / "vllm.log").read_text()
    assert f"goes to {tmp_path / 'vllm.log'}" in demo.stderr
    assert re.search(r"WARNING .*\[\w+\.py:\d+\]", log), log[:4000]  # vLLM's own logger
    assert "Loading safetensors checkpoint shards" in log  # a tqdm bar on descriptor 2
    if importlib.util.find_spec("matplotlib") is not None:
        assert (tmp_path / "demo.png").read_bytes().startswith(b"\x89PNG")
        assert f"picture: {tmp_path / 'demo.png'}" in demo.stdout
    else:
        assert "pip install 'kvstore-vllm[plot]'" in demo.stdout
    _assert_next_steps_work(demo.stdout, tmp_path)


def _assert_next_steps_work(stdout: str, directory: Path) -> None:
    store = shlex.quote(str(directory / "store"))
    printed = [line.strip() for line in stdout.splitlines()]
    for command in (f"kvstore stat {store}", f"kvstore verify {store}"):
        assert command in printed
        assert run(*shlex.split(command)[1:]).exit_code == 0, command
    assert any(line.startswith(f"kvstore ls {store}") for line in printed)
    assert f"kvstore demo --dir {shlex.quote(str(directory))} --metrics-port 9400" in printed
    assert any(line.startswith("watch -n1 ") for line in printed)
    assert any(line.startswith("kvstore serve ") for line in printed)
    assert any(line.startswith("prometheus --config.file=") for line in printed)
    assert "kvstore bench connector" in printed
