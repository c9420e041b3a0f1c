"""LMDB's file format, read with pread (never through the map): is a data file long enough?

A read through LMDB's memory map of a page past the end of the data file kills the process with
SIGBUS, so `tiers._lmdb_env` checks the file before it maps it and before every transaction.
What "long enough" means comes from mdb.c (LMDB 0.9, 64-bit, the format py-lmdb bundles):

- `MDB_meta.mm_last_pg` is the last page *allocated*, and "the file may be shorter if the freeDB
  lists the final pages" (mdb.c's own comment): a page allocated and freed inside one write
  transaction (a *loose* page, `P_LOOSE`) is never written by `mdb_page_flush`, and its number
  goes on the free list at commit. With `writemap=False` the file only grows by those writes,
  so a healthy file can end before `(mm_last_pg + 1) * page size`. (With `writemap` LMDB sizes
  the file to the whole map, so it never does.)
- "Each non-metapage up to `mm_last_pg` is reachable exactly once in the snapshot: either used
  by a database or listed in a freeDB record." Every page a snapshot uses was written when it
  was committed; only free pages can lie past the end.

So a file is safe to map for a snapshot when every page at or past its end (up to
`mm_last_pg`) is on that snapshot's free list, and the free list's own pages lie before it.
`first_page_in_use_past_end` answers exactly that, reading only the free-list tree: cheap, and
needed only when the quick bound (`needed_bytes`) says the file is shorter than `mm_last_pg`.

Pages change under a reader that holds no read transaction (a commit two transactions later may
reuse them); a page that does not parse as LMDB wrote it raises `PageChanged`, and callers
confirm any finding before they act on it (`tiers._lmdb_env`).
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass

__all__ = [
    "Meta",
    "PageChanged",
    "first_page_in_use_past_end",
    "newest_meta",
    "read_metas",
    "unknown_format",
]

_HEADER_BYTES = 16  # PAGEHDRSZ: pgno u64, pad u16, flags u16, lower u16, upper u16
_META_MAGIC = 0xBEEFC0DE
_META_VERSION = 1
_META_BYTES = 152  # header + MDB_meta
_INVALID_PAGE = (1 << 64) - 1  # P_INVALID: an empty database's root
_NODE_BYTES = 8  # NODESIZE: lo u16, hi u16, flags u16, ksize u16

_P_BRANCH = 0x01
_P_LEAF = 0x02
_P_OVERFLOW = 0x04
_F_BIGDATA = 0x01
_F_SUBDATA = 0x02
_F_DUPDATA = 0x04


class PageChanged(Exception):
    """A page did not parse as LMDB wrote it: a concurrent commit rewrote it under a reader
    without a read transaction, or the file is damaged (LMDB's own reads then say so)."""


@dataclass(frozen=True, slots=True)
class Meta:
    """One of the two meta pages: the root of a committed snapshot."""

    page_bytes: int
    last_page: int
    txn_id: int
    free_root: int
    main_root: int = _INVALID_PAGE  # the main database's root: the named databases' records

    @property
    def needed_bytes(self) -> int:
        """The size a file has if every allocated page was written: the quick bound."""
        return max(2, self.last_page + 1) * self.page_bytes


def read_metas(fd: int) -> list[Meta]:
    """The valid meta pages of the file (none if page 0 is not an LMDB meta page)."""
    first = _parse_meta(os.pread(fd, _META_BYTES, 0))
    if first is None:
        return []
    second = _parse_meta(os.pread(fd, _META_BYTES, first.page_bytes))
    return [first] if second is None or second.page_bytes != first.page_bytes else [first, second]


_KNOWN_FORMATS = (1, 2, 3)
"""Data formats LMDB writes: 1 for 0.9.x, 2 for a pre-1.0 development version, 3 for 1.0.x."""


def unknown_format(fd: int) -> int | None:
    """The data format the file's first bytes name, when it is none LMDB writes (a damaged meta
    page), else None. py-lmdb picks its engine by that number (the u32 after the first meta
    magic at a 4-byte step in the first 64 bytes) and refuses an unknown one as if it were
    merely another LMDB's."""
    head = os.pread(fd, 64, 0)
    for offset in range(0, len(head) - 7, 4):
        if struct.unpack_from("<I", head, offset)[0] == _META_MAGIC:
            (version,) = struct.unpack_from("<I", head, offset + 4)
            return None if version in _KNOWN_FORMATS else int(version)
    return None


def newest_meta(fd: int) -> Meta | None:
    """The meta page of the newest committed snapshot, or None if there is none."""
    return max(read_metas(fd), key=lambda meta: meta.txn_id, default=None)


def _parse_meta(page: bytes) -> Meta | None:
    """LMDB 0.9, 64-bit: magic and version at 16; the free DB's record at 40 (its pad is the
    page size, its root at 80), the main DB's at 88 (its root at 128); the last page and txn
    id at 136 and 144."""
    if len(page) < _META_BYTES:
        return None
    magic, version = struct.unpack_from("<II", page, 16)
    if magic != _META_MAGIC or version != _META_VERSION:
        return None
    page_bytes = int(struct.unpack_from("<I", page, 40)[0])
    if page_bytes < 512 or page_bytes & (page_bytes - 1):
        return None
    (free_root,) = struct.unpack_from("<Q", page, 80)
    (main_root,) = struct.unpack_from("<Q", page, 128)
    last_page, txn_id = struct.unpack_from("<QQ", page, 136)
    return Meta(page_bytes, int(last_page), int(txn_id), int(free_root), int(main_root))


def first_page_in_use_past_end(fd: int, meta: Meta, file_bytes: int) -> int | None:
    """The first page at or past the end of a `file_bytes`-long file that `meta`'s snapshot
    uses (a page of its free list, or one not on it), or None if every such page is free.
    Raises PageChanged if a free-list page does not parse."""
    end_page = file_bytes // meta.page_bytes
    if end_page > meta.last_page:
        return None
    free, past_end = _FreeListReader(fd, meta, end_page).read()
    if past_end is not None:
        return past_end
    return next((page for page in range(end_page, meta.last_page + 1) if page not in free), None)


class _FreeListReader:
    """Walks the free DB's tree, collecting the free page numbers at or past `end_page`."""

    def __init__(self, fd: int, meta: Meta, end_page: int) -> None:
        self._fd = fd
        self._page_bytes = meta.page_bytes
        self._root = meta.free_root
        self._last_page = meta.last_page
        self._end_page = end_page
        self._free: set[int] = set()

    def read(self) -> tuple[set[int], int | None]:
        """(free pages past the end, the first free-list page itself past the end or None)."""
        pending = [] if self._root == _INVALID_PAGE else [self._root]
        visited = 0
        while pending:
            number = pending.pop()
            if number >= self._end_page:
                return self._free, number
            visited += 1
            if visited > self._last_page:  # more pages than the file has: a cycle
                raise PageChanged("the free list's tree has a cycle")
            past_end = self._visit(number, pending)
            if past_end is not None:
                return self._free, past_end
        return self._free, None

    def _visit(self, number: int, pending: list[int]) -> int | None:
        page = os.pread(self._fd, self._page_bytes, number * self._page_bytes)
        offsets, flags = self._node_offsets(page, number)
        for offset in offsets:
            lo, hi, node_flags, key_bytes = struct.unpack_from("<HHHH", page, offset)
            if flags & _P_BRANCH:
                pending.append(lo | hi << 16 | node_flags << 32)
                continue
            if node_flags & (_F_SUBDATA | _F_DUPDATA):
                raise PageChanged(f"free-list page {number} has a sub-database node")
            data_at = offset + _NODE_BYTES + key_bytes
            past_end = self._collect(page, data_at, lo | hi << 16, node_flags & _F_BIGDATA)
            if past_end is not None:
                return past_end
        return None

    def _node_offsets(self, page: bytes, number: int) -> tuple[list[int], int]:
        if len(page) < self._page_bytes:
            raise PageChanged(f"free-list page {number} is cut short")
        pgno, _, flags, lower, upper = struct.unpack_from("<QHHHH", page, 0)
        kind = flags & (_P_BRANCH | _P_LEAF | _P_OVERFLOW)
        if (
            pgno != number
            or kind not in (_P_BRANCH, _P_LEAF)
            or not (_HEADER_BYTES <= lower <= upper <= self._page_bytes)
        ):
            raise PageChanged(f"page {number} is not a free-list tree page")
        count = (lower - _HEADER_BYTES) >> 1
        offsets = list(struct.unpack_from(f"<{count}H", page, _HEADER_BYTES))
        if any(not upper <= offset <= self._page_bytes - _NODE_BYTES for offset in offsets):
            raise PageChanged(f"free-list page {number} has a node outside the page")
        return offsets, flags

    def _collect(self, page: bytes, data_at: int, data_bytes: int, is_big: int) -> int | None:
        """Add one record's page numbers (an IDL: count, then pages); a page number if the
        record's overflow pages lie past the end."""
        if is_big:
            first = int(struct.unpack_from("<Q", page, data_at)[0])
            num_pages = (_HEADER_BYTES - 1 + data_bytes) // self._page_bytes + 1  # OVPAGES
            if first + num_pages > self._end_page:
                return max(first, self._end_page)
            data = os.pread(self._fd, data_bytes, first * self._page_bytes + _HEADER_BYTES)
            header = os.pread(self._fd, _HEADER_BYTES, first * self._page_bytes)
            if struct.unpack_from("<Q", header, 0)[0] != first or len(data) < data_bytes:
                raise PageChanged(f"overflow page {first} of the free list changed")
        else:
            data = page[data_at : data_at + data_bytes]
        if len(data) < 8 or len(data) % 8:
            raise PageChanged("a free-list record is not a list of page numbers")
        (count,) = struct.unpack_from("<Q", data, 0)
        if count * 8 + 8 > len(data):
            raise PageChanged("a free-list record is shorter than its count")
        end_page = self._end_page
        self._free.update(
            page_number
            for (page_number,) in struct.iter_unpack("<Q", data[8 : 8 + count * 8])
            if page_number >= end_page
        )
        return None
