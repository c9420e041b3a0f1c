"""How the store commands describe namespaces and chunks, in JSON and in tables."""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from typing import Any

from rich import box
from rich.console import JustifyMethod
from rich.table import Table

from kvstore.cli._common import SHORT_KEY_CHARS, iso_time
from tiers.errors import TierConfigError
from tiers.layout import ChunkLayout
from tiers.store import EntryMeta

__all__ = [
    "ChecksumState",
    "chunk_layout",
    "entry_json",
    "layout_summary",
    "new_table",
    "num_tokens_per_chunk",
]


class ChecksumState(StrEnum):
    """What is known about a chunk's checksum."""

    UNVERIFIED = "unverified"
    OK = "ok"
    CORRUPT = "corrupt"
    VANISHED = "vanished"  # deleted (by a live engine or another tool) while being read


def new_table(
    *columns: str,
    numeric: tuple[str, ...] = (),
    keys: tuple[str, ...] = (),
    wrap: tuple[str, ...] = (),
    title: str | None = None,
) -> Table:
    """A table with `numeric` columns right-aligned. `keys` columns hold short keys and are never
    cut, not even in a pipe (where rich assumes 80 columns): such a table packs its columns
    closer, and the `wrap` columns wrap when that is not enough."""
    table = Table(
        title=title,
        title_justify="left",
        header_style="bold",
        box=box.SIMPLE_HEAD,
        show_edge=False,
        collapse_padding=bool(keys),
    )
    for column in columns:
        justify: JustifyMethod = "right" if column in numeric else "left"
        if column in keys:
            table.add_column(column, justify=justify, no_wrap=True, min_width=SHORT_KEY_CHARS)
        elif column in wrap:
            table.add_column(column, justify=justify, overflow="fold")
        else:
            table.add_column(column, justify=justify, no_wrap=True)
    return table


def entry_json(meta: EntryMeta, state: ChecksumState = ChecksumState.UNVERIFIED) -> dict[str, Any]:
    """One chunk's metadata: full hex key, sizes in bytes, times in epoch seconds and ISO."""
    return {
        "key": meta.key.hex(),
        "namespace": meta.namespace,
        "size_bytes": meta.size_bytes,
        "num_hits": meta.num_hits,
        "created_s": meta.created_s,
        "created_iso": iso_time(meta.created_s),
        "last_access_s": meta.last_access_s,
        "last_access_iso": iso_time(meta.last_access_s),
        "checksum_xxh64": f"{meta.checksum:016x}",
        "checksum_state": state.value,
    }


def chunk_layout(descriptor: Mapping[str, Any]) -> tuple[ChunkLayout | None, str]:
    """The descriptor's chunk layout, or None and why it cannot be decoded."""
    raw = descriptor.get("chunk_layout")
    if raw is None:
        return None, (
            "the namespace descriptor has no chunk_layout (registered by a tool other than the "
            "engine), so chunks cannot be decoded"
        )
    if not isinstance(raw, Mapping):
        return None, f"the namespace's chunk_layout is a {type(raw).__name__}, not a mapping"
    try:
        return ChunkLayout.from_dict(raw), ""
    except TierConfigError as exc:
        return None, f"the namespace's chunk_layout cannot be read: {exc}"


def num_tokens_per_chunk(descriptor: Mapping[str, Any]) -> int | None:
    block_size = descriptor.get("engine_block_size")
    blocks = descriptor.get("blocks_per_chunk")
    if isinstance(block_size, int) and isinstance(blocks, int):
        return block_size * blocks
    return None


def layout_summary(descriptor: Mapping[str, Any]) -> str:
    """E.g. `"2 layers x [2, 32, 64] bfloat16"`, from the chunk layout or the engine's summary."""
    layout, _ = chunk_layout(descriptor)
    if layout is not None and layout.layers:
        shapes = {(*layer.parts_shape, *layer.slab_shape) for layer in layout.layers}
        dtypes = {layer.dtype for layer in layout.layers}
        shape = str(list(shapes.pop())) if len(shapes) == 1 else "mixed shapes"
        dtype = dtypes.pop() if len(dtypes) == 1 else "mixed dtypes"
        return f"{len(layout.layers)} layers x {shape} {dtype}"
    spec = descriptor.get("layout")
    if isinstance(spec, Mapping) and isinstance(spec.get("layers"), list):
        return f"{len(spec['layers'])} layers, {spec.get('kv_cache_layout', '?')} (no chunk_layout)"
    return "-"
