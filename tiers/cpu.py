"""The shared CPU region: one shared-memory file of fixed-size rows, mapped by every process.

**Who creates, who attaches.** The scheduler process creates the region (`CPURegion.create`) at
start and owns it: it records its pid in the header and unlinks the file on `close()`. Each worker
process attaches (`CPURegion.attach`) and only unmaps on `close()`. A chunk's row holds every
TP rank's slice; which bytes belong to whom is the caller's business.

**File layout.** A 4096-byte header page, then `num_rows` rows, each starting on a 4096-byte
boundary (`row_stride_bytes = round_up(row_bytes, 4096)`). Header (little endian): magic
`KVSTREG\\0`, format version u32, header bytes u32, owner pid i64, num_rows u64, row_bytes u64,
row_stride_bytes u64, created time f64 (epoch seconds). The magic is written last.

**Memory.** `create` reserves the whole file up front (`posix_fallocate`), so a region larger
than the free shared memory fails at start with `RegionError` rather than with a SIGBUS later;
every process maps it with `MAP_POPULATE`, so copies into rows take no page faults.

**Stale regions.** If `create` finds a file of that name whose owner pid is dead (or was reused
by a younger process), or whose header is unreadable, it logs a warning, removes it and creates a
fresh one. If the owner is alive it raises `RegionError`: never a crash loop.

**Pinning.** With CUDA available and `pin` not False, each process registers its own mapping
with `cudaHostRegister` (and unregisters it on close). With `pin=None` (the default) a host that
refuses (some sandboxes do not pin shared file mappings) gets a warning and an unpinned region:
copies are staged, not wrong. The CPU-only path never touches CUDA.

**Views.** `row(i)`, `row_tensor(i)` and `rows_tensor()` are zero-copy views. `close()` drops the
region's own references and unmaps; if the caller still holds views, the mapping stays alive
until they are freed (it is never unmapped under a live view), and a warning says so.
"""

from __future__ import annotations

import logging
import mmap
import os
import time
from pathlib import Path
from types import TracebackType
from typing import Literal

import numpy as np
import torch

from tiers._region_file import (
    DEFAULT_REGION_DIRECTORY,
    HEADER_STRUCT,
    PAGE_BYTES,
    REGION_FORMAT_VERSION,
    RegionHeader,
    map_shared,
    publish,
    reclaim_stale_regions,
    region_path,
    round_up,
)
from tiers.errors import RegionError, TierConfigError

__all__ = ["DEFAULT_REGION_DIRECTORY", "CPURegion", "RegionHeader", "reclaim_stale_regions"]

logger = logging.getLogger(__name__)


class CPURegion:
    """A shared-memory file of `num_rows` rows of `row_bytes` (see the module docstring).

    Thread-safety: views may be used from any thread; `close()` must not race with their use.
    """

    def __init__(
        self, path: Path, header: RegionHeader, mapping: mmap.mmap, *, is_owner: bool, pin: _Pin
    ) -> None:
        self.path = path
        self.header = header
        self.is_owner = is_owner
        self._mmap: mmap.mmap | None = mapping
        self._array: np.ndarray | None = np.frombuffer(mapping, dtype=np.uint8)
        self._base: torch.Tensor | None = torch.from_numpy(self._array)
        self.is_pinned = False
        if pin != "off":
            from tiers import _cuda

            try:
                _cuda.host_register(self._base.data_ptr(), self._base.numel())
            except RegionError as exc:
                if pin == "required":
                    self._base = self._array = None  # release the exports so the map can close
                    raise
                logger.warning(
                    "CPU region %s is not pinned (%s): copies to and from the GPU are staged "
                    "and slower; pin=False skips the attempt",
                    path,
                    exc,
                )
            except BaseException:
                self._base = self._array = None
                raise
            else:
                self.is_pinned = True

    @classmethod
    def create(
        cls,
        name: str,
        num_rows: int,
        row_bytes: int,
        *,
        directory: str | os.PathLike[str] = DEFAULT_REGION_DIRECTORY,
        pin: bool | None = None,
    ) -> CPURegion:
        """Create region `name` (owned by this process), reclaiming a stale file of that name."""
        if num_rows <= 0 or row_bytes <= 0:
            raise TierConfigError(
                f"num_rows and row_bytes must be positive, got num_rows={num_rows} "
                f"row_bytes={row_bytes}"
            )
        path = region_path(name, directory)
        header = RegionHeader(
            format_version=REGION_FORMAT_VERSION,
            owner_pid=os.getpid(),
            num_rows=num_rows,
            row_bytes=row_bytes,
            row_stride_bytes=round_up(row_bytes, PAGE_BYTES),
            created_s=time.time(),
        )
        mapping = publish(path, header)
        logger.info("created CPU region %s: %d rows of %d bytes", path, num_rows, row_bytes)
        return cls._finish(path, header, mapping, is_owner=True, pin=pin)

    @classmethod
    def attach(
        cls,
        name: str,
        *,
        directory: str | os.PathLike[str] = DEFAULT_REGION_DIRECTORY,
        num_rows: int | None = None,
        row_bytes: int | None = None,
        pin: bool | None = None,
    ) -> CPURegion:
        """Map an existing region; `num_rows`/`row_bytes`, when given, must match its header."""
        path = region_path(name, directory)
        try:
            with path.open("r+b") as file:
                header = RegionHeader.unpack(file.read(HEADER_STRUCT.size), path)
                _check_sizes(path, header, num_rows, row_bytes)
                if os.fstat(file.fileno()).st_size < header.file_bytes:
                    raise RegionError(
                        f"region file {path} is shorter than its header says "
                        f"({header.file_bytes} bytes)"
                    )
                mapping = map_shared(file.fileno(), header.file_bytes)
        except FileNotFoundError as exc:
            raise RegionError(f"no CPU region {name!r} in {path.parent}") from exc
        except OSError as exc:
            raise RegionError(f"cannot attach CPU region {path}: {exc}") from exc
        return cls._finish(path, header, mapping, is_owner=False, pin=pin)

    @classmethod
    def _finish(
        cls, path: Path, header: RegionHeader, mapping: mmap.mmap, *, is_owner: bool,
        pin: bool | None,
    ) -> CPURegion:  # fmt: skip
        try:
            return cls(path, header, mapping, is_owner=is_owner, pin=_resolve_pin(pin))
        except BaseException:
            mapping.close()
            if is_owner:
                path.unlink(missing_ok=True)
            raise

    @property
    def num_rows(self) -> int:
        return self.header.num_rows

    @property
    def row_bytes(self) -> int:
        return self.header.row_bytes

    @property
    def is_closed(self) -> bool:
        return self._base is None

    def row(self, index: int) -> memoryview:
        """Row `index` as a writable memoryview (zero-copy)."""
        return self.row_tensor(index).numpy().data.cast("B")

    def row_tensor(self, index: int) -> torch.Tensor:
        """Row `index` as a 1-D uint8 tensor (zero-copy)."""
        if not 0 <= index < self.num_rows:
            raise RegionError(f"row {index} is out of range; allowed 0..{self.num_rows - 1}")
        start = PAGE_BYTES + index * self.header.row_stride_bytes
        return self._require_base()[start : start + self.row_bytes]

    def rows_tensor(self) -> torch.Tensor:
        """All rows as a `[num_rows, row_bytes]` uint8 tensor (strided, zero-copy)."""
        base = self._require_base()
        return torch.as_strided(
            base,
            size=(self.num_rows, self.row_bytes),
            stride=(self.header.row_stride_bytes, 1),
            storage_offset=PAGE_BYTES,
        )

    def close(self) -> None:
        """Unpin, unmap and (owner only) unlink. Idempotent."""
        base, self._base, self._array = self._base, None, None
        if base is None:
            return
        if self.is_pinned:
            from tiers import _cuda

            _cuda.host_unregister(base.data_ptr())
            self.is_pinned = False
        del base
        mapping, self._mmap = self._mmap, None
        if mapping is not None:
            try:
                mapping.close()
            except BufferError:
                logger.warning(
                    "CPU region %s closed while row views are alive; it is unmapped when they "
                    "are freed",
                    self.path,
                )
        if self.is_owner:
            self.path.unlink(missing_ok=True)
            logger.info("removed CPU region %s", self.path)

    def __enter__(self) -> CPURegion:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.is_closed else ("owner" if self.is_owner else "attached")
        return (
            f"CPURegion({str(self.path)!r}, num_rows={self.num_rows}, "
            f"row_bytes={self.row_bytes}, {state})"
        )

    def _require_base(self) -> torch.Tensor:
        if self._base is None:
            raise RegionError(f"CPU region {self.path} is closed")
        return self._base


_Pin = Literal["off", "required", "if_possible"]


def _resolve_pin(pin: bool | None) -> _Pin:
    """`pin=None`: pin when CUDA is present, and run unpinned (a warning) if the host refuses;
    `pin=True`: pin or fail."""
    if pin is False:
        return "off"
    has_cuda = torch.cuda.is_available()
    if pin and not has_cuda:
        raise TierConfigError("pin=True needs a CUDA device; none is available (use pin=None)")
    if not has_cuda:
        return "off"
    return "required" if pin else "if_possible"


def _check_sizes(
    path: Path, header: RegionHeader, num_rows: int | None, row_bytes: int | None
) -> None:
    if (num_rows is not None and num_rows != header.num_rows) or (
        row_bytes is not None and row_bytes != header.row_bytes
    ):
        raise RegionError(
            f"region {path} has num_rows={header.num_rows} row_bytes={header.row_bytes}; "
            f"the caller expected num_rows={num_rows} row_bytes={row_bytes}"
        )
