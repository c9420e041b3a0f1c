"""A byte-exact view over vLLM's per-layer KV tensors that gathers and scatters whole blocks.

`PagedKVView(kv_caches, num_blocks)` takes the mapping given to `register_kv_caches`
(layer name -> tensor) and copies whole engine blocks, for a list of block ids, into or out of a
flat uint8 chunk buffer laid out as `tiers.layout` documents (layer-major, then part, then block).

**Block dimension.** Per layer, the block dim is the first dim whose size equals `num_blocks`,
except that a leading dim of size 2 (a K/V split) is skipped when a later dim also has size
`num_blocks` (so `[2, num_blocks, ...]` with `num_blocks == 2` picks dim 1). Dims before the block
dim are *parts*; dims after it are the block's *slab*. Pass `block_dim=` to override the rule.

**Layouts.** Any strides work: vLLM's CPU backend (`[num_blocks, kv_heads, block_size,
2 * head_size]`, every layer a view into one shared allocation), the CUDA K/V split
`[2, num_blocks, ...]`, `[num_blocks, 2, ...]`, head-outermost and cross-layer
(`buf[:, layer]`) layouts. Layers that are equally spaced views of one storage with the same
shape and strides are *stacked* into one strided tensor, so one copy moves a run of consecutive
blocks for all of those layers at once.

**Bytes, not values.** Layers are viewed as uint8 (their last dim must have stride 1), so every
dtype round-trips bit for bit.

**Devices.** On CPU, copies run on the calling thread (and torch's intra-op threads): one copy
per run of consecutive block ids and group of stacked layers, or, for a whole chunk of mostly
scattered ids, one `index_select` per group (measured faster; see `benchmarks/README.md`).
On CUDA, per group, `gather` does one `index_select` into a device staging tensor and one
`copy_(non_blocking=True)` into `out`; `scatter` is the reverse (`index_copy_`). They are
enqueued on `stream` (or the current stream) and return before the copy is done: the caller
records an event on that stream and waits on it before reading `out` or reusing `src`. `out` and
`src` should then be pinned (see `CPURegion`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from tiers.errors import TierConfigError
from tiers.layout import ChunkLayout, LayerLayout, dtype_name

__all__ = ["ChunkCopy", "PagedKVView", "find_block_dim"]

logger = logging.getLogger(__name__)


def find_block_dim(shape: Sequence[int], num_blocks: int) -> int:
    """The block dim of a layer of `shape` (rule in the module docstring); -1 if none."""
    matches = [dim for dim, size in enumerate(shape) if size == num_blocks]
    if not matches:
        return -1
    if shape[0] == 2 and matches[0] == 0 and len(matches) > 1:
        return matches[1]
    return matches[0]


@dataclass(frozen=True, slots=True)
class _Group:
    """Consecutive layers stacked into one uint8 tensor `(num_layers, *parts, blocks, *slab)`."""

    tensor: torch.Tensor
    block_dim: int
    offset_per_block_bytes: int  # this group's buffer offset, per block in the chunk
    bytes_per_block: int  # this group's bytes per block, all layers and parts

    def buffer_view(self, buffer: torch.Tensor, num_blocks: int) -> torch.Tensor:
        start = self.offset_per_block_bytes * num_blocks
        section = buffer[start : start + self.bytes_per_block * num_blocks]
        shape = list(self.tensor.shape)
        shape[self.block_dim] = num_blocks
        return section.view(shape)


@dataclass(frozen=True, slots=True)
class ChunkCopy:
    """One chunk buffer of a batched transfer: blocks `block_ids` <-> positions `first_block...`
    of `buffer` (a 1-D uint8 tensor holding the whole chunk)."""

    block_ids: Sequence[int]
    buffer: torch.Tensor
    first_block: int = 0


@dataclass(frozen=True, slots=True)
class _Layer:
    name: str
    tensor: torch.Tensor  # uint8 view
    block_dim: int
    layout: LayerLayout  # offset_bytes is per block here; scaled by the chunk size


class PagedKVView:
    """Gathers and scatters whole engine blocks of every layer (see the module docstring).

    Not thread-safe for concurrent scatters to the same blocks; the transfer engine serialises
    them. `gather`/`scatter` never allocate on CPU.
    """

    def __init__(
        self,
        kv_caches: Mapping[str, torch.Tensor],
        num_blocks: int,
        *,
        block_dim: int | None = None,
    ) -> None:
        if num_blocks <= 0:
            raise TierConfigError(f"num_blocks must be positive, got {num_blocks}")
        if not kv_caches:
            raise TierConfigError("kv_caches is empty; expected at least one layer tensor")
        self.num_blocks = num_blocks
        layers = [_make_layer(n, t, num_blocks, block_dim) for n, t in kv_caches.items()]
        offset = 0
        placed: list[_Layer] = []
        for layer in layers:
            placed.append(_with_offset(layer, offset))
            offset += layer.layout.num_parts * layer.layout.slab_bytes
        self._layers = tuple(placed)
        self.block_bytes = offset
        self._groups = tuple(_stack_layers(self._layers))
        devices = {layer.tensor.device for layer in self._layers}
        if len(devices) != 1:
            raise TierConfigError(
                f"all layers must be on one device, got {sorted(map(str, devices))}"
            )
        self.device = devices.pop()
        logger.debug(
            "PagedKVView: %d layers in %d stacked groups, %d bytes per block on %s",
            len(self._layers), len(self._groups), self.block_bytes, self.device,
        )  # fmt: skip

    @property
    def layer_names(self) -> tuple[str, ...]:
        return tuple(layer.name for layer in self._layers)

    @property
    def num_groups(self) -> int:
        """How many stacked groups the layers form (1 for vLLM's shared CPU allocation)."""
        return len(self._groups)

    def buffer_bytes(self, num_blocks_in_chunk: int) -> int:
        """Bytes of a chunk buffer holding `num_blocks_in_chunk` blocks."""
        return self.block_bytes * num_blocks_in_chunk

    def chunk_layout(self, blocks_per_chunk: int) -> ChunkLayout:
        """The self-describing layout of a buffer of `blocks_per_chunk` blocks."""
        if blocks_per_chunk <= 0:
            raise TierConfigError(f"blocks_per_chunk must be positive, got {blocks_per_chunk}")
        layers = tuple(
            LayerLayout(
                name=layer.name,
                dtype=layer.layout.dtype,
                parts_shape=layer.layout.parts_shape,
                slab_shape=layer.layout.slab_shape,
                offset_bytes=layer.layout.offset_bytes * blocks_per_chunk,
            )
            for layer in self._layers
        )
        return ChunkLayout(blocks_per_chunk=blocks_per_chunk, layers=layers)

    def gather(
        self,
        block_ids: Sequence[int],
        out: torch.Tensor,
        *,
        first_block: int = 0,
        stream: Any = None,
    ) -> int:
        """Copy the blocks `block_ids` into chunk positions `first_block, first_block + 1, ...`
        of the chunk buffer `out`; other positions are left as they are.

        `out` is a 1-D contiguous uint8 tensor (e.g. a `CPURegion` row or a slice of one) of
        exactly `buffer_bytes(n)` bytes for a chunk of `n` blocks. Returns the bytes copied.
        """
        ids = self._check_ids(block_ids)
        num_chunk_blocks = self._check_buffer(out, len(ids), first_block, "out")
        if self.device.type == "cuda":
            from tiers import _cuda

            _cuda.gather(self._groups, ids, out, num_chunk_blocks, first_block, stream)
        else:
            _gather_cpu(self._groups, ids, out, num_chunk_blocks, first_block)
        return self.buffer_bytes(len(ids))

    def scatter(
        self,
        block_ids: Sequence[int],
        src: torch.Tensor,
        *,
        first_block: int = 0,
        stream: Any = None,
    ) -> int:
        """Copy chunk positions `first_block, first_block + 1, ...` of the chunk buffer `src`
        into the blocks `block_ids` (the inverse of `gather`).

        A block id that repeats receives the bytes of its last occurrence. Returns bytes copied.
        """
        ids = self._check_ids(block_ids)
        num_chunk_blocks = self._check_buffer(src, len(ids), first_block, "src")
        if self.device.type == "cuda":
            from tiers import _cuda

            _cuda.scatter(self._groups, ids, src, num_chunk_blocks, first_block, stream)
        else:
            _scatter_cpu(self._groups, ids, src, num_chunk_blocks, first_block)
        return self.buffer_bytes(len(ids))

    def gather_many(self, items: Sequence[ChunkCopy], *, stream: Any = None) -> int:
        """`gather` for several chunk buffers at once; returns the bytes copied.

        On the CPU every copy of every item goes to torch in ONE call (`_foreach_copy_`): a copy
        loop in a background thread gives up the GIL after each copy and waits up to the switch
        interval to get it back while vLLM's step loop runs, which made a 63-chunk job take a
        second instead of milliseconds.
        """
        if self.device.type == "cuda":
            return sum(self.gather(i.block_ids, i.buffer, first_block=i.first_block,
                                   stream=stream) for i in items)  # fmt: skip
        return self._copy_many(items, to_buffer=True)

    def scatter_many(self, items: Sequence[ChunkCopy], *, stream: Any = None) -> int:
        """`scatter` for several chunk buffers at once (see `gather_many`); in item order."""
        if self.device.type == "cuda":
            return sum(self.scatter(i.block_ids, i.buffer, first_block=i.first_block,
                                    stream=stream) for i in items)  # fmt: skip
        return self._copy_many(items, to_buffer=False)

    def _copy_many(self, items: Sequence[ChunkCopy], *, to_buffer: bool) -> int:
        dsts: list[torch.Tensor] = []
        srcs: list[torch.Tensor] = []
        num_bytes = 0
        for item in items:
            ids = self._check_ids(item.block_ids)
            what = "out" if to_buffer else "src"
            num_chunk_blocks = self._check_buffer(item.buffer, len(ids), item.first_block, what)
            for group in self._groups:
                chunk = group.buffer_view(item.buffer, num_chunk_blocks)
                for position, start, length in _runs(ids):
                    engine_part = group.tensor.narrow(group.block_dim, start, length)
                    at = item.first_block + position
                    buffer_part = chunk.narrow(group.block_dim, at, length)
                    dsts.append(buffer_part if to_buffer else engine_part)
                    srcs.append(engine_part if to_buffer else buffer_part)
            num_bytes += self.buffer_bytes(len(ids))
        if dsts:
            torch._foreach_copy_(dsts, srcs)
        return num_bytes

    def _check_ids(self, block_ids: Sequence[int]) -> list[int]:
        ids = [int(b) for b in block_ids]
        if not ids:
            raise TierConfigError("block_ids is empty; expected at least one block id")
        low, high = min(ids), max(ids)
        if low < 0 or high >= self.num_blocks:
            bad = low if low < 0 else high
            raise TierConfigError(
                f"block id {bad} is out of range; allowed 0..{self.num_blocks - 1}"
            )
        return ids

    def _check_buffer(self, buffer: torch.Tensor, num_ids: int, first_block: int, what: str) -> int:
        """Validate a chunk buffer; returns how many blocks the chunk holds."""
        if buffer.dtype != torch.uint8 or buffer.dim() != 1 or buffer.stride(0) != 1:
            raise TierConfigError(
                f"{what} must be a contiguous 1-D uint8 tensor, got dtype={buffer.dtype} "
                f"shape={tuple(buffer.shape)} stride={tuple(buffer.stride())}"
            )
        num_chunk_blocks, remainder = divmod(buffer.numel(), self.block_bytes)
        if remainder:
            raise TierConfigError(
                f"{what} has {buffer.numel()} bytes; expected a whole number of blocks of "
                f"{self.block_bytes} bytes (buffer_bytes(n))"
            )
        if first_block < 0 or first_block + num_ids > num_chunk_blocks:
            raise TierConfigError(
                f"{num_ids} blocks from chunk position {first_block} do not fit in {what}, "
                f"a chunk of {num_chunk_blocks} blocks"
            )
        if buffer.device.type != "cpu" and buffer.device != self.device:
            raise TierConfigError(
                f"{what} is on {buffer.device}; expected cpu or the KV cache's {self.device}"
            )
        return num_chunk_blocks


def _gather_cpu(
    groups: Sequence[_Group], ids: list[int], out: torch.Tensor, num_chunk_blocks: int,
    first_block: int,
) -> None:  # fmt: skip
    runs = _runs(ids)
    is_whole_chunk = first_block == 0 and len(ids) == num_chunk_blocks
    if is_whole_chunk and len(runs) > len(ids) // 2:
        # Mostly scattered ids: one index_select per group writes each layer's section in order
        # and measured faster than a copy per block (see benchmarks/README.md).
        index = torch.tensor(ids, dtype=torch.int64)
        for group in groups:
            dst = group.buffer_view(out, num_chunk_blocks)
            torch.index_select(group.tensor, group.block_dim, index, out=dst)
        return
    for group in groups:
        dst = group.buffer_view(out, num_chunk_blocks)
        for position, start, length in runs:
            src = group.tensor.narrow(group.block_dim, start, length)
            dst.narrow(group.block_dim, first_block + position, length).copy_(src)


def _scatter_cpu(
    groups: Sequence[_Group], ids: list[int], src: torch.Tensor, num_chunk_blocks: int,
    first_block: int,
) -> None:  # fmt: skip
    # A copy per run, in order, so a repeated id keeps its last occurrence (index_copy_ measured
    # 5x slower and leaves repeats undefined).
    for group in groups:
        source = group.buffer_view(src, num_chunk_blocks)
        for position, start, length in _runs(ids):
            dst = group.tensor.narrow(group.block_dim, start, length)
            dst.copy_(source.narrow(group.block_dim, first_block + position, length))


def _runs(ids: Sequence[int]) -> list[tuple[int, int, int]]:
    """Runs of consecutive block ids as `(position in ids, first block id, length)`."""
    runs: list[tuple[int, int, int]] = []
    position = 0
    for index in range(1, len(ids) + 1):
        if index == len(ids) or ids[index] != ids[index - 1] + 1:
            runs.append((position, ids[position], index - position))
            position = index
    return runs


def _make_layer(name: str, tensor: torch.Tensor, num_blocks: int, block_dim: int | None) -> _Layer:
    shape = tuple(tensor.shape)
    dim = find_block_dim(shape, num_blocks) if block_dim is None else block_dim
    if not 0 <= dim < len(shape) or shape[dim] != num_blocks:
        raise TierConfigError(
            f"layer {name!r} of shape {list(shape)} has no block dim of size {num_blocks}"
            + ("" if block_dim is None else f" at block_dim={block_dim}")
        )
    if dim == len(shape) - 1 and tensor.element_size() > 1:
        raise TierConfigError(
            f"layer {name!r} of shape {list(shape)} has its block dim last; expected at least "
            "one dim after it"
        )
    if tensor.stride(-1) != 1 and shape[-1] > 1:
        raise TierConfigError(
            f"layer {name!r} has last-dim stride {tensor.stride(-1)}; expected 1 so its bytes "
            "can be copied as uint8"
        )
    as_bytes = tensor.view(torch.uint8) if tensor.dtype != torch.uint8 else tensor
    layout = LayerLayout(
        name=name,
        dtype=dtype_name(tensor.dtype),
        parts_shape=shape[:dim],
        slab_shape=shape[dim + 1 :],
        offset_bytes=0,
    )
    return _Layer(name=name, tensor=as_bytes, block_dim=dim, layout=layout)


def _with_offset(layer: _Layer, offset_per_block_bytes: int) -> _Layer:
    layout = LayerLayout(
        name=layer.layout.name,
        dtype=layer.layout.dtype,
        parts_shape=layer.layout.parts_shape,
        slab_shape=layer.layout.slab_shape,
        offset_bytes=offset_per_block_bytes,
    )
    return _Layer(name=layer.name, tensor=layer.tensor, block_dim=layer.block_dim, layout=layout)


def _stackable(first: _Layer, other: _Layer) -> bool:
    a, b = first.tensor, other.tensor
    return (
        a.shape == b.shape
        and a.stride() == b.stride()
        and first.block_dim == other.block_dim
        and a.device == b.device
        and a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()
    )


def _stack_layers(layers: Sequence[_Layer]) -> list[_Group]:
    """Group consecutive, equally spaced views of one storage into stacked tensors."""
    groups: list[_Group] = []
    index = 0
    while index < len(layers):
        first = layers[index]
        end = index + 1
        delta = 0
        if end < len(layers) and _stackable(first, layers[end]):
            delta = int(layers[end].tensor.storage_offset() - first.tensor.storage_offset())
        while (
            delta > 0
            and end < len(layers)
            and _stackable(first, layers[end])
            and layers[end].tensor.storage_offset()
            == first.tensor.storage_offset() + (end - index) * delta
        ):
            end += 1
        groups.append(_make_group(layers[index:end], delta))
        index = end
    return groups


def _make_group(layers: Sequence[_Layer], delta_bytes: int) -> _Group:
    first = layers[0].tensor
    stacked = torch.as_strided(
        first,
        size=(len(layers), *first.shape),
        stride=(delta_bytes, *first.stride()),
        storage_offset=first.storage_offset(),
    )
    layer_bytes = layers[0].layout.num_parts * layers[0].layout.slab_bytes
    return _Group(
        tensor=stacked,
        block_dim=layers[0].block_dim + 1,
        offset_per_block_bytes=layers[0].layout.offset_bytes,
        bytes_per_block=layer_bytes * len(layers),
    )
