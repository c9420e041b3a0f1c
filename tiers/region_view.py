"""`RegionView`: a read-only mapping of a CPU region's rows, without torch.

`CPURegion` (in `tiers.cpu`) creates and owns a region and hands out tensors; a process that only
reads rows (kvstore's disk-writer process, which copies them into LMDB) maps the file with this
instead, so it starts without importing torch. The file layout is `tiers.cpu`'s.
"""

from __future__ import annotations

import contextlib
import mmap
import os
from pathlib import Path
from types import TracebackType

from tiers._region_file import HEADER_STRUCT, PAGE_BYTES, RegionHeader
from tiers.errors import RegionError

__all__ = ["RegionView"]


class RegionView:
    """Rows of the region file at `path`, mapped read-only; `row(i)` is a zero-copy view.

    Thread-safety: views may be used from any thread; `close()` must not race with their use.
    """

    def __init__(self, path: Path, header: RegionHeader, mapping: mmap.mmap) -> None:
        self.path = path
        self.header = header
        self._mmap: mmap.mmap | None = mapping
        self._view: memoryview | None = memoryview(mapping)

    @classmethod
    def open(cls, path: str | os.PathLike[str]) -> RegionView:
        """Map the region file at `path`; `RegionError` if it is missing, short or not a region."""
        file_path = Path(path)
        try:
            with file_path.open("rb") as file:
                header = RegionHeader.unpack(file.read(HEADER_STRUCT.size), file_path)
                if os.fstat(file.fileno()).st_size < header.file_bytes:
                    raise RegionError(
                        f"region file {file_path} is shorter than its header says "
                        f"({header.file_bytes} bytes)"
                    )
                mapping = mmap.mmap(file.fileno(), header.file_bytes, access=mmap.ACCESS_READ)
        except OSError as exc:
            raise RegionError(f"cannot map CPU region {file_path}: {exc}") from exc
        return cls(file_path, header, mapping)

    @property
    def num_rows(self) -> int:
        return self.header.num_rows

    @property
    def row_bytes(self) -> int:
        return self.header.row_bytes

    def row(self, index: int) -> memoryview:
        """Row `index` as a read-only memoryview (zero-copy)."""
        if self._view is None:
            raise RegionError(f"region view of {self.path} is closed")
        if not 0 <= index < self.header.num_rows:
            raise RegionError(f"row {index} is out of range; allowed 0..{self.num_rows - 1}")
        start = PAGE_BYTES + index * self.header.row_stride_bytes
        return self._view[start : start + self.header.row_bytes]

    def close(self) -> None:
        """Unmap (a row view still held keeps the mapping alive until it is freed)."""
        view, self._view = self._view, None
        mapping, self._mmap = self._mmap, None
        # A caller's row view still exports the mapping: it is freed with that view.
        with contextlib.suppress(BufferError):
            if view is not None:
                view.release()
            if mapping is not None:
                mapping.close()

    def __enter__(self) -> RegionView:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()
