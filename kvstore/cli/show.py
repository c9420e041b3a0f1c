"""`kvstore show STORE KEY`: one chunk's metadata and a per-layer decode of its bytes.

The value is read with its checksum verified, then decoded with the `chunk_layout` the engine
registered in the namespace descriptor: one rank's slice per tensor-parallel rank (rank r at
`r * row_bytes // tp_size`), each layer as a typed tensor, summarised by min/max/mean/NaNs. The
engine's descriptor in the remote tier carries no chunk layout: there, `show` prints the
metadata and says why it cannot decode (as for a store namespace another tool registered).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from kvstore.cli._chunks import ChecksumState, ChunkRead
from kvstore.cli._common import (
    EXIT_FAILURE,
    cli_errors,
    emit_json,
    err_console,
    format_bytes,
    relative_time,
)
from kvstore.cli._describe import (
    NO_LAYOUT_REASON,
    chunk_layout,
    entry_json,
    group_of,
    new_table,
)
from kvstore.cli._source import (
    ChunkSource,
    PasswordEnvOption,
    StoreArgument,
    TimeoutOption,
    open_source,
    resolve_key,
    resolve_namespaces,
)
from kvstore.cli.app import app
from tiers.errors import TierConfigError

if TYPE_CHECKING:
    import torch

__all__ = ["Decoded", "decode_chunk", "show"]


@dataclass(slots=True)
class Decoded:
    """Per-layer summaries of a chunk, or why there are none."""

    tp_size: int = 1
    layers: list[dict[str, Any]] = field(default_factory=list)
    skipped_reason: str = ""


def layer_summary(rank: int, name: str, tensor: torch.Tensor) -> dict[str, Any]:
    """Shape, dtype and min/max/mean over the non-NaN values, and the NaN count."""
    import torch  # only `show` decodes chunks: the other commands start without torch

    values = tensor.reshape(-1).to(torch.float64)
    is_nan = torch.isnan(values)
    rest = values[~is_nan]
    has_values = rest.numel() > 0
    return {
        "rank": rank,
        "name": name,
        "dtype": str(tensor.dtype).removeprefix("torch."),
        "shape": list(tensor.shape),
        "num_elements": values.numel(),
        "min": float(rest.min()) if has_values else None,
        "max": float(rest.max()) if has_values else None,
        "mean": float(rest.mean()) if has_values else None,
        "num_nan": int(is_nan.sum()),
    }


def decode_chunk(
    value: memoryview,
    descriptor: Mapping[str, Any],
    *,
    no_layout_reason: str = NO_LAYOUT_REASON,
    group: Mapping[str, Any] | None = None,
) -> Decoded:
    """Decode every rank's slice of `value` with the descriptor's chunk layout."""
    layout, reason = chunk_layout(descriptor, no_layout_reason=no_layout_reason)
    tp_size = descriptor.get("tp_size", 1)
    row_bytes = descriptor.get("row_bytes", value.nbytes)
    if not isinstance(tp_size, int) or tp_size < 1:
        return Decoded(skipped_reason=f"the descriptor's tp_size {tp_size!r} is not an int >= 1")
    if layout is None:
        return Decoded(tp_size, skipped_reason=reason)
    if row_bytes != value.nbytes or value.nbytes % tp_size:
        return Decoded(
            tp_size,
            skipped_reason=f"the value has {value.nbytes} bytes; the descriptor says row_bytes="
            f"{row_bytes} split over tp_size={tp_size} ranks",
        )
    slice_bytes = value.nbytes // tp_size
    decoded = Decoded(tp_size)
    # a hybrid engine's row holds one KV cache group's layers: the layout names those of the
    # first group, which every group matches in shape
    names = (group or {}).get("layers")
    for rank in range(tp_size):
        piece = value[rank * slice_bytes : (rank + 1) * slice_bytes]
        try:
            tensors = layout.decode(piece)
        except TierConfigError as exc:
            return Decoded(tp_size, skipped_reason=f"rank {rank}'s slice cannot be decoded: {exc}")
        if isinstance(names, list) and len(names) == len(tensors):
            tensors = dict(zip(names, tensors.values(), strict=True))
        decoded.layers.extend(layer_summary(rank, n, t) for n, t in tensors.items())
    return decoded


def _number(value: float | None) -> str:
    return "-" if value is None else f"{value:.4g}"


def _common_prefix(texts: Sequence[str]) -> str:
    first, last = min(texts), max(texts)
    size = 0
    while size < min(len(first), len(last)) and first[size] == last[size]:
        size += 1
    return first[:size]


def short_layer_names(names: Sequence[str]) -> tuple[list[str], str]:
    """Names without their common prefix and suffix, and the pattern (`*` for the rest):
    `model.layers.0.self_attn.attn` -> `0` with `model.layers.*.self_attn.attn`."""
    if len(set(names)) < 2:
        return list(names), ""
    prefix = _common_prefix(names)
    suffix = _common_prefix([name[len(prefix) :][::-1] for name in names])[::-1]
    short = [name[len(prefix) : len(name) - len(suffix)] for name in names]
    if not all(short) or not (prefix or suffix):
        return list(names), ""
    return short, f"{prefix}*{suffix}"


def _fields(rows: Sequence[tuple[str, str]]) -> Table:
    table = Table.grid(padding=(0, 2))
    table.add_column(style="dim")
    table.add_column()
    for name, value in rows:
        table.add_row(name, escape(value))
    return table


def _group_line(group: Mapping[str, Any]) -> str:
    """E.g. `1: sliding window 64 tokens (model.layers.1.self_attn.attn)`."""
    kind = str(group.get("kind", "?"))
    if group.get("window_tokens"):
        kind += f" window {group['window_tokens']} tokens"
    layers = group.get("layers")
    named = f" ({', '.join(map(str, layers))})" if isinstance(layers, list) else ""
    return f"{group['index']}: {kind}{named}"


def _print_show(document: Mapping[str, Any]) -> None:
    console = Console(highlight=False)
    chunk = document["chunk"]
    now = time.time()
    created, accessed = chunk["created_s"], chunk["last_access_s"]
    size, memory, hits = chunk["size_bytes"], chunk["memory_bytes"], chunk["num_hits"]
    checksum = chunk["checksum_xxh64"]
    rows = [
        ("key", chunk["key"]),
        ("namespace", chunk["namespace"]),
        *([("group", _group_line(chunk["group"]))] if "group" in chunk else []),
        ("size", "-" if size is None else f"{format_bytes(size)} ({size:,} B)"),
        *([("memory", f"{format_bytes(memory)} ({memory:,} B)")] if memory is not None else []),
        ("hits", "-" if hits is None else f"{hits:,}"),
        ("created", _when(created, chunk["created_iso"], now)),
        ("last access", _when(accessed, chunk["last_access_iso"], now)),
        ("checksum", f"xxh64 {checksum or '-'}: {chunk['checksum_state']}"),
        ("model", str(document["descriptor"].get("model", "-"))),
        ("TP size", str(document["tp_size"])),
    ]
    console.print(_fields(rows))
    if document["decode_skipped_reason"]:
        console.print(f"no decode: {escape(document['decode_skipped_reason'])}")
        return
    console.print(_layer_table(document["layers"], has_ranks=document["tp_size"] > 1))


def _when(epoch_s: float | None, iso: str | None, now_s: float) -> str:
    return "-" if epoch_s is None else f"{relative_time(epoch_s, now_s)} ({iso})"


def _layer_table(layers: Sequence[Mapping[str, Any]], *, has_ranks: bool) -> Table:
    names, pattern = short_layer_names([layer["name"] for layer in layers])
    title = f"layers ({pattern})" if pattern else "layers"
    columns = (*(("rank",) if has_ranks else ()), "layer", "dtype", "shape")
    numeric = ("rank", "min", "max", "mean", "NaN")
    table = new_table(*columns, "min", "max", "mean", "NaN", numeric=numeric, title=title)
    for layer, name in zip(layers, names, strict=True):
        table.add_row(
            *((str(layer["rank"]),) if has_ranks else ()),
            escape(name),
            layer["dtype"],
            "x".join(str(d) for d in layer["shape"]),
            *(_number(layer[k]) for k in ("min", "max", "mean")),
            f"{layer['num_nan']:,}",
        )
    return table


def _decode(source: ChunkSource, read: ChunkRead, descriptor: Mapping[str, Any]) -> Decoded:
    if read.value is not None:
        return decode_chunk(
            read.value,
            descriptor,
            no_layout_reason=source.no_layout_reason,
            group=group_of(descriptor, read.key),
        )
    if read.state is ChecksumState.CORRUPT:
        return Decoded(skipped_reason=f"the value fails its checksum: {read.error}")
    if read.state is ChecksumState.NEWER_FORMAT:
        return Decoded(skipped_reason=f"the value cannot be read: {read.error}")
    return Decoded(skipped_reason="the chunk was deleted while reading")


@app.command()
def show(
    store: StoreArgument,
    key: Annotated[str, typer.Argument(help="A hex prefix of the chunk's key.")],
    namespace: Annotated[
        str | None, typer.Option(help="Look in this namespace only (an id or a unique prefix).")
    ] = None,
    password_env: PasswordEnvOption = None,
    timeout_ms: TimeoutOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON document on stdout.")] = False,
) -> None:
    """A chunk's metadata and per-layer decode (verifies its checksum while reading)."""
    with cli_errors(), open_source(store, password_env, timeout_ms) as source:
        meta = resolve_key(source, key, resolve_namespaces(source, namespace))
        descriptor = source.namespaces().get(meta.namespace, {})
        (read,) = source.read_many(meta.namespace, [meta.key])
        decoded = _decode(source, read, descriptor)
        document = {
            **source.where(),
            "chunk": entry_json(read.meta or meta, read.state, descriptor),
            "descriptor": descriptor,
            "tp_size": decoded.tp_size,
            "decode_skipped_reason": decoded.skipped_reason or None,
            "layers": decoded.layers,
        }
    if as_json:
        emit_json(document)
    else:
        _print_show(document)
    if read.state is not ChecksumState.OK:
        err_console().print(f"[red]error:[/red] {escape(decoded.skipped_reason)}")
        raise typer.Exit(EXIT_FAILURE)
