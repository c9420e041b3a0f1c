"""CUDA code paths for `PagedKVView` and `CPURegion`, imported only when CUDA is in use.

Nothing here runs on the CPU-only path; it is written to the same contracts as the CPU code and
covered by the tests marked `cuda`.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import logging
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import torch

from tiers.errors import RegionError

if TYPE_CHECKING:
    from tiers.paged import _Group

__all__ = ["clear_last_error", "gather", "host_register", "host_unregister", "scatter"]

logger = logging.getLogger(__name__)


@contextlib.contextmanager
def _on_stream(stream: Any) -> Iterator[Any]:
    current = stream if stream is not None else torch.cuda.current_stream()
    with torch.cuda.stream(current):
        yield current


def gather(
    groups: Sequence[_Group],
    ids: list[int],
    out: torch.Tensor,
    num_chunk_blocks: int,
    first_block: int,
    stream: Any,
) -> None:
    """Per group: one `index_select` into a device staging tensor, one async copy into `out`."""
    device = groups[0].tensor.device
    with _on_stream(stream) as current:
        index = torch.tensor(ids, dtype=torch.int64).to(device, non_blocking=True)
        for group in groups:
            staging = torch.index_select(group.tensor, group.block_dim, index)
            dst = group.buffer_view(out, num_chunk_blocks)
            dst.narrow(group.block_dim, first_block, len(ids)).copy_(staging, non_blocking=True)
            staging.record_stream(current)
        index.record_stream(current)


def scatter(
    groups: Sequence[_Group],
    ids: list[int],
    src: torch.Tensor,
    num_chunk_blocks: int,
    first_block: int,
    stream: Any,
) -> None:
    """Per group: one async copy of `src`'s section to the device, one `index_copy_`.

    Repeated ids keep their last occurrence (like the CPU path) by dropping earlier positions.
    """
    device = groups[0].tensor.device
    last_position = {block_id: position for position, block_id in enumerate(ids)}
    with _on_stream(stream) as current:
        index = torch.tensor(list(last_position), dtype=torch.int64).to(device, non_blocking=True)
        positions = None
        if len(last_position) != len(ids):
            positions = torch.tensor(list(last_position.values()), dtype=torch.int64)
            positions = positions.to(device, non_blocking=True)
            positions.record_stream(current)
        for group in groups:
            section = group.buffer_view(src, num_chunk_blocks)
            section = section.narrow(group.block_dim, first_block, len(ids))
            staging = section.to(device, non_blocking=True)
            if positions is not None:
                staging = staging.index_select(group.block_dim, positions)
            group.tensor.index_copy_(group.block_dim, index, staging)
            staging.record_stream(current)
        index.record_stream(current)


def _cudart() -> Any:
    return getattr(torch.cuda, "cudart")()  # noqa: B009  (untyped in torch's stubs)


def host_register(address: int, size_bytes: int) -> None:
    """Pin `size_bytes` of host memory at `address` for fast async copies (cudaHostRegister).

    A refusal (some hosts and sandboxes do not pin shared file mappings) raises RegionError
    after clearing the CUDA runtime's last error: left set, the next kernel launch check reports
    it as its own (seen on an H200: torch's `index_select` failed with "invalid argument")."""
    result = _cudart().cudaHostRegister(address, size_bytes, 0)
    if int(result) != 0:
        clear_last_error()
        raise RegionError(
            f"cudaHostRegister of {size_bytes} bytes at {address:#x} failed with error "
            f"{int(result)}; pass pin=False to use unpinned memory"
        )


def clear_last_error() -> None:
    """Reset the CUDA runtime's last error (`cudaGetLastError`, which torch's bindings lack) in
    the runtime library torch loaded; nothing when it cannot be found."""
    runtime = _loaded_runtime()
    if runtime is not None:
        runtime.cudaGetLastError()


@functools.cache
def _loaded_runtime() -> ctypes.CDLL | None:
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
            paths = {line.split()[-1] for line in maps if "libcudart.so" in line}
    except OSError:
        return None
    for path in sorted(paths):
        with contextlib.suppress(OSError):
            return ctypes.CDLL(path)  # already loaded: the same library, the same state
    return None


def host_unregister(address: int) -> None:
    """Undo `host_register`; logs (does not raise) on failure, since it runs during cleanup."""
    result = _cudart().cudaHostUnregister(address)
    if int(result) != 0:
        clear_last_error()
        logger.warning("cudaHostUnregister at %#x failed with error %d", address, int(result))
