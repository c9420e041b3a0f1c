"""The chunk buffer layout: how gathered engine blocks are laid out in one flat byte buffer.

A chunk buffer holds `blocks_per_chunk` engine blocks of every layer, **layer-major**:

    for each layer, in the fixed order of the engine's `kv_caches` mapping:
        for each part (the dims before the block dim, e.g. K and V; one part if none), row-major:
            for each block, in `block_ids` order:
                the block's slab: the dims after the block dim, as raw bytes, row-major

So layer `l` starts at `layers[l].offset_bytes` and occupies
`num_parts * blocks_per_chunk * slab_bytes` bytes; part `p` of block `i` of that layer starts at
`offset_bytes + (p * blocks_per_chunk + i) * slab_bytes`. Bytes are copied, not values, so any
dtype (including fp8 NaN patterns) round-trips exactly. `ChunkLayout` describes this for a reader
that has only the stored bytes and the descriptor (no engine), e.g. a CLI showing per-layer stats.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tiers.errors import TierConfigError

if TYPE_CHECKING:
    import torch

__all__ = ["ChunkLayout", "LayerLayout", "dtype_from_name", "dtype_name"]

_LAYOUT_VERSION = 1


# Bytes per element of the dtypes KV caches use, by torch's own name: reading a layout (the CLI's
# `stat`, `ls`) needs only sizes, and must not import torch (~1.5 s) to get them.
_ITEMSIZES = {
    "float64": 8, "float32": 4, "float16": 2, "bfloat16": 2,
    "float8_e4m3fn": 1, "float8_e5m2": 1, "float8_e4m3fnuz": 1, "float8_e5m2fnuz": 1,
    "int64": 8, "int32": 4, "int16": 2, "int8": 1, "uint8": 1,
}  # fmt: skip


def dtype_name(dtype: torch.dtype) -> str:
    """`torch.bfloat16` -> `"bfloat16"`."""
    return str(dtype).removeprefix("torch.")


def canonical_dtype_name(name: str) -> str:
    """`"bfloat16"` -> `"bfloat16"`, `"half"` -> `"float16"`; TierConfigError if unknown."""
    return name if name in _ITEMSIZES else dtype_name(dtype_from_name(name))


def dtype_itemsize(name: str) -> int:
    """Bytes per element of the dtype named `name` (torch's names)."""
    itemsize = _ITEMSIZES.get(name)
    return itemsize if itemsize is not None else dtype_from_name(name).itemsize


def dtype_from_name(name: str) -> torch.dtype:
    """`"bfloat16"` -> `torch.bfloat16`; raises TierConfigError for an unknown name."""
    import torch

    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise TierConfigError(
            f"unknown dtype name {name!r}; expected a torch dtype such as 'bfloat16'"
        )
    return dtype


def _count(value: object) -> int:
    """A non-negative int from a decoded description (no bools, floats or strings)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise TierConfigError(
            f"malformed chunk layout description: expected an int >= 0, got {value!r:.80}"
        )
    return value


def _layer_from_dict(item: Mapping[str, Any]) -> LayerLayout:
    if not isinstance(item, Mapping):
        raise TierConfigError(f"chunk layout layer must be a mapping, got {item!r:.80}")
    name, dtype = item["name"], item["dtype"]
    if not isinstance(name, str) or not isinstance(dtype, str):
        raise TierConfigError(
            f"chunk layout layer name and dtype must be strings, got {name!r:.80}, {dtype!r:.40}"
        )
    return LayerLayout(
        name=name,
        dtype=canonical_dtype_name(dtype),
        parts_shape=tuple(_count(d) for d in item["parts_shape"]),
        slab_shape=tuple(_count(d) for d in item["slab_shape"]),
        offset_bytes=_count(item["offset_bytes"]),
    )


@dataclass(frozen=True, slots=True)
class LayerLayout:
    """One layer's section of a chunk buffer."""

    name: str
    dtype: str
    parts_shape: tuple[int, ...]
    slab_shape: tuple[int, ...]
    offset_bytes: int

    @property
    def num_parts(self) -> int:
        return math.prod(self.parts_shape)

    @property
    def slab_bytes(self) -> int:
        """Bytes of one block of one part."""
        return math.prod(self.slab_shape) * dtype_itemsize(self.dtype)

    def section_bytes(self, blocks_per_chunk: int) -> int:
        return self.num_parts * blocks_per_chunk * self.slab_bytes


@dataclass(frozen=True, slots=True)
class ChunkLayout:
    """The layout of a chunk buffer of `blocks_per_chunk` blocks (see the module docstring)."""

    blocks_per_chunk: int
    layers: tuple[LayerLayout, ...]

    @property
    def buffer_bytes(self) -> int:
        return sum(layer.section_bytes(self.blocks_per_chunk) for layer in self.layers)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-safe description (only str, int and lists)."""
        return {
            "version": _LAYOUT_VERSION,
            "blocks_per_chunk": self.blocks_per_chunk,
            "buffer_bytes": self.buffer_bytes,
            "layers": [
                {
                    "name": layer.name,
                    "dtype": layer.dtype,
                    "parts_shape": list(layer.parts_shape),
                    "slab_shape": list(layer.slab_shape),
                    "offset_bytes": layer.offset_bytes,
                }
                for layer in self.layers
            ],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ChunkLayout:
        """Inverse of `to_dict`; raises TierConfigError for a malformed or unknown description,
        including one whose sections would not fit, or not align in, its buffer."""
        try:
            version = _count(data["version"])
            if version != _LAYOUT_VERSION:
                raise TierConfigError(
                    f"chunk layout version {version} is not supported; expected {_LAYOUT_VERSION}"
                )
            layers = tuple(_layer_from_dict(item) for item in data["layers"])
            layout = cls(blocks_per_chunk=_count(data["blocks_per_chunk"]), layers=layers)
            recorded = data.get("buffer_bytes")
            recorded_bytes = None if recorded is None else _count(recorded)
        except TierConfigError:
            raise
        except (KeyError, TypeError, ValueError, OverflowError, AttributeError) as exc:
            raise TierConfigError(f"malformed chunk layout description: {exc!r:.200}") from exc
        if layout.blocks_per_chunk < 1:
            raise TierConfigError(
                f"chunk layout blocks_per_chunk must be >= 1, got {layout.blocks_per_chunk}"
            )
        if recorded_bytes is not None and recorded_bytes != layout.buffer_bytes:
            raise TierConfigError(
                f"chunk layout says buffer_bytes={recorded} but its layers add up to "
                f"{layout.buffer_bytes}"
            )
        layout.check_sections()
        return layout

    def check_sections(self) -> None:
        """Every layer's section lies inside the buffer, aligned to its dtype."""
        for layer in self.layers:
            end = layer.offset_bytes + layer.section_bytes(self.blocks_per_chunk)
            itemsize = dtype_itemsize(layer.dtype)
            if end > self.buffer_bytes or layer.offset_bytes % itemsize:
                raise TierConfigError(
                    f"chunk layout layer {layer.name[:80]!r} at offset {layer.offset_bytes} "
                    f"({end - layer.offset_bytes} bytes of {layer.dtype}) does not fit, aligned, "
                    f"in a buffer of {self.buffer_bytes} bytes"
                )

    def decode(
        self, buffer: torch.Tensor | bytes | bytearray | memoryview
    ) -> dict[str, torch.Tensor]:
        """Per-layer typed tensors of shape `(*parts_shape, blocks_per_chunk, *slab_shape)`.

        Zero-copy views for a uint8 tensor or a writable buffer; a read-only buffer (`bytes`) is
        copied once. Raises TierConfigError if the buffer is shorter than `buffer_bytes`.
        """
        flat = _as_uint8_tensor(buffer)
        if flat.numel() < self.buffer_bytes:
            raise TierConfigError(
                f"buffer has {flat.numel()} bytes; this chunk layout needs {self.buffer_bytes}"
            )
        decoded: dict[str, torch.Tensor] = {}
        for layer in self.layers:
            size_bytes = layer.section_bytes(self.blocks_per_chunk)
            section = flat[layer.offset_bytes : layer.offset_bytes + size_bytes]
            typed = section.view(dtype_from_name(layer.dtype))
            shape = (*layer.parts_shape, self.blocks_per_chunk, *layer.slab_shape)
            decoded[layer.name] = typed.view(shape)
        return decoded


def _as_uint8_tensor(buffer: torch.Tensor | bytes | bytearray | memoryview) -> torch.Tensor:
    import torch

    if isinstance(buffer, torch.Tensor):
        if buffer.dtype != torch.uint8 or buffer.dim() != 1 or not buffer.is_contiguous():
            raise TierConfigError(
                f"expected a contiguous 1-D uint8 tensor, got dtype={buffer.dtype} "
                f"shape={tuple(buffer.shape)}"
            )
        return buffer
    view = memoryview(buffer).cast("B")
    if view.readonly:
        view = memoryview(bytearray(view))
    if view.nbytes == 0:
        return torch.empty(0, dtype=torch.uint8)
    return torch.frombuffer(view, dtype=torch.uint8)
