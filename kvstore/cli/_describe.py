"""How the store commands describe namespaces and chunks, in JSON and in tables."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rich import box
from rich.console import JustifyMethod
from rich.table import Table

from kvstore.cli._chunks import ChecksumState, ChunkMeta
from kvstore.cli._common import SHORT_KEY_CHARS, iso_time
from tiers.errors import TierConfigError
from tiers.layout import ChunkLayout

__all__ = [
    "NO_LAYOUT_REASON",
    "chunk_layout",
    "entry_json",
    "layout_summary",
    "new_table",
    "num_tokens_per_chunk",
]


NO_LAYOUT_REASON = (
    "the namespace descriptor has no chunk_layout (registered by a tool other than the engine), "
    "so chunks cannot be decoded"
)


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


def entry_json(
    meta: ChunkMeta,
    state: ChecksumState = ChecksumState.UNVERIFIED,
    descriptor: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """One chunk's metadata: full hex key, sizes in bytes, times in epoch seconds and ISO; null
    for what the backend does not record (Redis: hits, creation; size and checksum until read);
    a hybrid engine's entries also name their KV cache group (`group_of`)."""
    group = group_of(descriptor, meta.key) if descriptor else None
    return {
        **({} if group is None else {"group": group}),
        "key": meta.key.hex(),
        "namespace": meta.namespace,
        "size_bytes": meta.size_bytes,
        "memory_bytes": meta.memory_bytes,
        "num_hits": meta.num_hits,
        "created_s": meta.created_s,
        "created_iso": iso_time(meta.created_s),
        "last_access_s": meta.last_access_s,
        "last_access_iso": iso_time(meta.last_access_s),
        "checksum_xxh64": None if meta.checksum is None else f"{meta.checksum:016x}",
        "checksum_state": state.value,
    }


def group_of(descriptor: Mapping[str, Any], key: bytes) -> dict[str, Any] | None:
    """The KV cache group of a hybrid engine's entry (its key ends in the group's index; the
    engine's groups are in the descriptor's `layout.groups`): index, kind, window, layers.
    None for an engine with one group."""
    layout = descriptor.get("layout")
    groups = layout.get("groups") if isinstance(layout, Mapping) else None
    if not isinstance(groups, list) or len(groups) < 2 or not key:
        return None
    index = key[-1]
    group = groups[index] if index < len(groups) and isinstance(groups[index], Mapping) else {}
    return {"index": index, **group}


def chunk_layout(
    descriptor: Mapping[str, Any], *, no_layout_reason: str = NO_LAYOUT_REASON
) -> tuple[ChunkLayout | None, str]:
    """The descriptor's chunk layout, or None and why it cannot be decoded."""
    raw = descriptor.get("chunk_layout")
    if raw is None:
        return None, no_layout_reason
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
