"""A misspelled key fails while vLLM builds its config: before any engine process starts or any
model loads, with kvstore's message as the last line (issue 21)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.engine

REPO = Path(__file__).resolve().parents[1]
_SCRIPT = """
import sys
from vllm import LLM
from vllm.config import KVTransferConfig

if __name__ == "__main__":
    LLM(model=sys.argv[1], skip_tokenizer_init=True, kv_cache_memory_bytes=64 << 20,
        kv_transfer_config=KVTransferConfig(
            kv_connector="KVStoreConnector", kv_connector_module_path="kvstore.vllm",
            kv_role="kv_both", kv_connector_extra_config={"cpu_byte": 1 << 26}))
"""


def test_a_misspelled_key_fails_before_the_model_loads(tiny_model_dir: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)  # vLLM's default, as a user has it
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-c", _SCRIPT, str(tiny_model_dir)],
        capture_output=True, text=True, env=env, timeout=600, check=False,
    )  # fmt: skip
    print(f"failed after {time.monotonic() - started:.1f} s")
    output = done.stdout + done.stderr
    lines = [line for line in output.splitlines() if line.strip()]
    assert done.returncode == 1, output[-3000:]
    assert lines[-1].startswith(
        "kvstore.errors.ExtraConfigError: unknown kv_connector_extra_config key(s) ['cpu_byte'] "
        "(did you mean 'cpu_bytes'?); allowed: ["
    ), lines[-5:]
    for sign_of_a_start in ("EngineCore", "Starting to load model", "Loading weights"):
        assert sign_of_a_start not in output, sign_of_a_start


def test_the_same_key_spelled_right_passes_the_early_check(tiny_model_dir: Path) -> None:
    """The check fires on the typo, not on every KVStoreConnector config: building vLLM's
    config with the right key succeeds (no engine is started)."""
    code = (
        "from vllm.engine.arg_utils import EngineArgs\n"
        "from vllm.config import KVTransferConfig\n"
        f"args = EngineArgs(model={str(tiny_model_dir)!r}, skip_tokenizer_init=True,\n"
        "    kv_transfer_config=KVTransferConfig(kv_connector='KVStoreConnector',\n"
        "    kv_connector_module_path='kvstore.vllm', kv_role='kv_both',\n"
        "    kv_connector_extra_config={'cpu_bytes': 1 << 26}))\n"
        "args.create_engine_config()\nprint('config built')\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                          timeout=600, check=False)  # fmt: skip
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    assert "config built" in done.stdout
