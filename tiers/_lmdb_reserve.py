"""Disk blocks for a `writemap` writer, allocated before LMDB stores into its pages.

With `writemap` LMDB writes values straight into its shared memory map, and on Linux it sizes
the data file to the whole map as a sparse file. A store into a mapped page that no disk block
backs, on a full filesystem, kills the process with SIGBUS instead of failing the commit. So
before each write transaction the writer makes sure every page that transaction can touch is
backed: the pages in use (up to LMDB's last page) and room for the new ones past it
(`posix_fallocate`, in steps, so it is one system call per step, not one per transaction).
A filesystem that cannot give that room raises `StoreNoSpaceError` before LMDB touches a page,
and the store is unchanged; the caller can then write without `writemap`, where LMDB reuses
free pages inside the file and a full disk fails a commit cleanly (`kvstore.diskwriter.child`
does exactly that).

Why only with `writemap`: without it LMDB writes pages with `pwrite`, which fails with ENOSPC.
What this does not cover: a filesystem that fails a store into an allocated block (copy-on-write
filesystems such as btrfs can, on overwrite); such a store still takes the writer down with
SIGBUS, which is why only kvstore's disk-writer process, never the engine's, opens `writemap`.
"""

from __future__ import annotations

import errno
import logging
import os

from tiers.errors import StoreNoSpaceError

__all__ = ["SLACK_BYTES", "DiskReservation", "pages_bytes"]

logger = logging.getLogger(__name__)

SLACK_BYTES = 2 << 20
"""Room for what a transaction writes besides its values: leaf and branch pages it splits or
copies, the free list LMDB saves at commit."""
_STEP_BYTES = 64 << 20
_PAGE_HEADER_BYTES = 16


def pages_bytes(value_bytes: int, page_bytes: int) -> int:
    """The bytes of the pages one value of `value_bytes` takes (an overflow run, or a share of a
    leaf page, counted as one page)."""
    return -(-(value_bytes + _PAGE_HEADER_BYTES) // page_bytes) * page_bytes


class DiskReservation:
    """Allocated disk blocks of one data file, from its start up to `reserved_bytes`."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self._fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        self.reserved_bytes = 0
        self._is_supported = True

    def ensure(self, end_bytes: int, limit_bytes: int) -> None:
        """Blocks for every byte before `end_bytes`, allocating up to a step more (never past
        `limit_bytes`, the map's size). Raises StoreNoSpaceError if the filesystem cannot give
        them (nothing is written then)."""
        end_bytes = min(end_bytes, limit_bytes)  # past the map, LMDB fails with MapFullError
        if end_bytes <= self.reserved_bytes or not self._is_supported:
            return
        wanted = min(max(end_bytes, self.reserved_bytes + _STEP_BYTES), limit_bytes)
        for target in dict.fromkeys((max(wanted, end_bytes), end_bytes)):
            try:
                os.posix_fallocate(self._fd, 0, target)
            except OSError as exc:
                if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                    continue
                if exc.errno in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENODEV):
                    logger.warning(
                        "cannot allocate disk blocks ahead of LMDB's writes (%s); a full "
                        "filesystem will end the writing process",
                        exc,
                    )
                    self._is_supported = False
                    return
                raise
            self.reserved_bytes = target
            return
        raise StoreNoSpaceError(
            f"the filesystem has no room for the {end_bytes - self.reserved_bytes} bytes of "
            "pages this write may need past the ones already allocated"
        )

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
