"""`kvstore size`: bytes per token from a model's config or its shape, and the /dev/shm check."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kvstore.cli import app
from kvstore.config import KVStoreConfig

LLAMA_3_8B = {  # the fields of meta-llama/Meta-Llama-3-8B's config.json that matter here
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "hidden_size": 4096,
    "torch_dtype": "bfloat16",
}


def _invoke(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, ["size", *args])
    return result.exit_code, result.stdout, result.stderr


def test_llama_3_8b_takes_128_kib_per_token(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(LLAMA_3_8B))
    code, out, _ = _invoke("--model", str(tmp_path), "--tokens", "1000", "--disk-tokens", "10")
    assert code == 0
    assert "= 131,072 B" in out  # 2 x 32 x 8 x 128 x 2
    snippet = json.loads(out.splitlines()[-1].split(": ", 1)[1])
    assert snippet["cpu_bytes"] == 1000 * 131072
    assert snippet["disk_bytes"] == 10 * 131072
    KVStoreConfig.from_extra_config(snippet)  # what it prints is a valid config


def test_explicit_shape_and_fp8(tmp_path: Path) -> None:
    code, out, _ = _invoke(
        "--layers", "2", "--kv-heads", "4", "--head-dim", "64", "--dtype", "fp8",
        "--tokens", "10", "--json", "--region-dir", str(tmp_path),
    )  # fmt: skip
    assert code == 0
    doc = json.loads(out)
    assert doc["bytes_per_token"] == 2 * 2 * 4 * 64
    assert doc["cpu_bytes"] == 10 * 1024
    assert doc["region_dir"]["warning"] is None


def test_head_dim_defaults_to_hidden_size_over_heads(tmp_path: Path) -> None:
    config = {**LLAMA_3_8B, "text_config": {"num_hidden_layers": 4}}  # multimodal layout
    (tmp_path / "config.json").write_text(json.dumps(config))
    code, out, _ = _invoke("--model", str(tmp_path / "config.json"), "--tokens", "1", "--json")
    assert code == 0
    assert json.loads(out)["bytes_per_token"] == 2 * 4 * 8 * 128 * 2


def test_warns_when_the_region_does_not_fit() -> None:
    code, _, err = _invoke(
        "--layers", "80", "--kv-heads", "8", "--head-dim", "128", "--tokens", str(10**9)
    )
    assert code == 0
    assert "warning: /dev/shm has" in err
    assert "--shm-size" in err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--tokens", "5"], "give --model PATH"),
        (["--layers", "2", "--kv-heads", "2", "--tokens", "5"], "give --model PATH"),
        (["--layers", "2", "--kv-heads", "2", "--head-dim", "8", "--dtype", "int3",
          "--tokens", "5"], "--dtype: 'int3'"),
    ],
)
def test_usage_errors_exit_2(args: list[str], message: str) -> None:
    code, _, err = _invoke(*args)
    assert code == 2
    assert message in err


def test_a_model_without_config_or_with_mla_exits_2(tmp_path: Path) -> None:
    code, _, err = _invoke("--model", str(tmp_path), "--tokens", "5")
    assert (code, "no config.json there" in err) == (2, True)
    (tmp_path / "config.json").write_text(json.dumps({**LLAMA_3_8B, "kv_lora_rank": 512}))
    code, _, err = _invoke("--model", str(tmp_path), "--tokens", "5")
    assert (code, "MLA model" in err) == (2, True)
