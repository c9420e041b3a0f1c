"""The CLI reads what the real engine writes: `kvstore demo`, then ls/stat/show/verify."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from .helpers import run, run_json

pytestmark = pytest.mark.engine


def test_cli_reads_the_store_the_demo_leaves(tmp_path: Path) -> None:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    demo = subprocess.run(
        [sys.executable, "-c", "from kvstore.cli import main; main()", "demo", "--dir",
         str(tmp_path), "--no-baseline", "--turns", "2", "--conversations", "2", "--json"],
        capture_output=True, text=True, timeout=600, env=env, check=False,
    )  # fmt: skip
    assert demo.returncode == 0, demo.stderr[-4000:]
    report = json.loads(demo.stdout)  # one JSON document: vLLM's logs went to stderr
    assert report["num_requests"] == 4
    store = tmp_path / "store"

    stat = run_json("stat", store)
    assert stat["num_entries"] > 0
    (namespace,) = stat["namespaces"]
    assert namespace["has_chunk_layout"]
    assert namespace["created_by"].startswith("kvstore")

    chunks = run_json("ls", store, "--verify")["chunks"]
    assert len(chunks) == stat["num_entries"]
    assert {chunk["checksum_state"] for chunk in chunks} == {"ok"}

    shown = run_json("show", store, chunks[0]["key"][:10])
    assert shown["decode_skipped_reason"] is None
    assert len(shown["layers"]) == len(namespace_layers(shown["descriptor"]))
    assert all(layer["num_nan"] == 0 for layer in shown["layers"])

    assert run_json("verify", store)["num_corrupt"] == 0
    assert run("stat", store).exit_code == 0


def namespace_layers(descriptor: dict[str, object]) -> list[object]:
    layout = descriptor["chunk_layout"]
    assert isinstance(layout, dict)
    layers = layout["layers"]
    assert isinstance(layers, list)
    return layers
