"""`kvstore size`: turn a model's shape and a number of tokens into `cpu_bytes` and `disk_bytes`.

One token's KV is `2 (K and V) x layers x KV heads x head_dim x dtype bytes`, for the whole
model: a CPU row holds every tensor-parallel rank's slice, so TP does not change it. The shape
comes from a Hugging Face `config.json` (`--model DIR` or the file itself) or from
`--layers/--kv-heads/--head-dim`. The CPU region is one file in `/dev/shm` (`region_dir`),
reserved whole at start: the command warns when that filesystem is smaller (Docker gives 64 MiB
unless `--shm-size` says otherwise).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from kvstore.cli._common import UsageError, cli_errors, emit_json, err_console, format_bytes
from kvstore.cli.app import app

__all__ = ["KVShape", "shape_from_config", "size"]

# Bytes per element of the KV cache dtypes (vLLM's --kv-cache-dtype names and torch's names).
DTYPE_BYTES = {
    "float32": 4, "float": 4, "float16": 2, "half": 2, "bfloat16": 2,
    "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1, "float8_e4m3fn": 1, "float8_e5m2": 1,
}  # fmt: skip
_CONFIG_NAME = "config.json"


@dataclass(frozen=True, slots=True)
class KVShape:
    """What one token's KV takes, for the whole model."""

    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype: str

    @property
    def bytes_per_token(self) -> int:
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * DTYPE_BYTES[self.dtype]


def shape_from_config(path: Path, dtype: str | None) -> KVShape:
    """The KV shape of a Hugging Face model config (a directory holding config.json, or it)."""
    file = path / _CONFIG_NAME if path.is_dir() else path
    try:
        config = json.loads(file.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise UsageError(f"--model {path}: no {_CONFIG_NAME} there") from exc
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UsageError(f"--model {path}: cannot read {file}: {exc}") from exc
    if not isinstance(config, dict):
        raise UsageError(f"--model {path}: {file} is not a JSON object")
    text = config.get("text_config")  # multimodal models keep the language model's shape here
    config = {**config, **text} if isinstance(text, dict) else config
    if "kv_lora_rank" in config:
        raise UsageError(
            f"--model {path}: an MLA model (kv_lora_rank); give its KV shape with --layers, "
            "--kv-heads 1 and --head-dim (kv_lora_rank + qk_rope_head_dim)"
        )
    try:
        num_heads = int(config["num_attention_heads"])
        return KVShape(
            num_layers=int(config["num_hidden_layers"]),
            num_kv_heads=int(config.get("num_key_value_heads") or num_heads),
            head_dim=int(config.get("head_dim") or int(config["hidden_size"]) // num_heads),
            dtype=_dtype(dtype or config.get("torch_dtype") or config.get("dtype") or "bfloat16"),
        )
    except (KeyError, TypeError, ValueError, ZeroDivisionError) as exc:
        raise UsageError(
            f"--model {path}: {file} lacks a usable {exc} (num_hidden_layers, "
            "num_attention_heads, num_key_value_heads, head_dim or hidden_size); give the "
            "shape with --layers/--kv-heads/--head-dim"
        ) from exc


def _dtype(name: str) -> str:
    name = str(name).removeprefix("torch.")
    if name not in DTYPE_BYTES:
        raise UsageError(f"--dtype: {name!r} is not one of {', '.join(DTYPE_BYTES)}")
    return name


def _shape(
    model: Path | None,
    layers: int | None,
    kv_heads: int | None,
    head_dim: int | None,
    dtype: str | None,
) -> KVShape:
    explicit = (layers, kv_heads, head_dim)
    if model is not None:
        if any(value is not None for value in explicit):
            raise UsageError("give --model or --layers/--kv-heads/--head-dim, not both")
        return shape_from_config(model, dtype)
    if layers is None or kv_heads is None or head_dim is None:
        raise UsageError("give --model PATH, or all of --layers, --kv-heads and --head-dim")
    return KVShape(layers, kv_heads, head_dim, _dtype(dtype or "bfloat16"))


def _shm_check(region_dir: Path, cpu_bytes: int) -> dict[str, Any]:
    """The region filesystem's size and free space, and a warning if the region cannot fit."""
    try:
        stats = os.statvfs(region_dir)
    except OSError as exc:
        return {"path": str(region_dir), "warning": f"cannot read {region_dir}: {exc.strerror}"}
    total, free = stats.f_frsize * stats.f_blocks, stats.f_frsize * stats.f_bavail
    warning = None
    if cpu_bytes > free:
        warning = (
            f"{region_dir} has {format_bytes(free)} free of {format_bytes(total)}; the CPU "
            f"region needs {format_bytes(cpu_bytes)} at start. Lower cpu_bytes, free space, "
            "or give the container more (docker run --shm-size=...)"
        )
    return {"path": str(region_dir), "total_bytes": total, "free_bytes": free, "warning": warning}


@app.command()
def size(
    tokens: Annotated[int, typer.Option(min=1, help="Tokens of KV the CPU tier should hold.")],
    disk_tokens: Annotated[
        int | None, typer.Option(min=1, help="Tokens of KV the disk tier should hold.")
    ] = None,
    model: Annotated[
        Path | None, typer.Option(help="A model directory with config.json (or the file).")
    ] = None,
    layers: Annotated[int | None, typer.Option(min=1, help="Attention layers.")] = None,
    kv_heads: Annotated[int | None, typer.Option(min=1, help="KV heads (all TP ranks).")] = None,
    head_dim: Annotated[int | None, typer.Option(min=1, help="Head dimension.")] = None,
    dtype: Annotated[
        str | None, typer.Option(help="KV cache dtype (default: the model's, else bfloat16).")
    ] = None,
    region_dir: Annotated[
        Path, typer.Option(help="Where the CPU region goes (kvstore's region_dir).")
    ] = Path("/dev/shm"),
    as_json: Annotated[bool, typer.Option("--json", help="One JSON document on stdout.")] = False,
) -> None:
    """cpu_bytes and disk_bytes for a number of tokens of a model's KV cache."""
    with cli_errors():
        shape = _shape(model, layers, kv_heads, head_dim, dtype)
    cpu_bytes = tokens * shape.bytes_per_token
    disk_bytes = None if disk_tokens is None else disk_tokens * shape.bytes_per_token
    shm = _shm_check(region_dir, cpu_bytes)
    extra: dict[str, Any] = {"cpu_bytes": cpu_bytes}
    if disk_bytes is not None:
        extra.update(disk_path="/path/to/kvstore", disk_bytes=disk_bytes)
    if as_json:
        emit_json({"bytes_per_token": shape.bytes_per_token, **extra, "region_dir": shm})
    else:
        _print(shape, tokens, disk_tokens, extra)
    if shm.get("warning"):
        err_console().print(f"[yellow]warning:[/yellow] {shm['warning']}")


def _print(shape: KVShape, tokens: int, disk_tokens: int | None, extra: dict[str, Any]) -> None:
    out = Console(highlight=False, soft_wrap=True)
    out.print(
        f"KV per token: 2 x {shape.num_layers} layers x {shape.num_kv_heads} KV heads x "
        f"{shape.head_dim} head_dim x {DTYPE_BYTES[shape.dtype]} B ({shape.dtype}) "
        f"= {shape.bytes_per_token:,} B"
    )
    out.print(f"cpu_bytes   {extra['cpu_bytes']:,} ({format_bytes(extra['cpu_bytes'])}) "
              f"for {tokens:,} tokens")  # fmt: skip
    if disk_tokens is not None:
        out.print(f"disk_bytes  {extra['disk_bytes']:,} ({format_bytes(extra['disk_bytes'])}) "
                  f"for {disk_tokens:,} tokens")  # fmt: skip
    out.print(f'"kv_connector_extra_config": {json.dumps(extra)}')
