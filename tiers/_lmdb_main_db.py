"""Is a snapshot's tree readable without LMDB reading past the data file's end?

LMDB's main database holds one record per named database; opening a store reads it (the
named databases' handles), and the main database's root is the last page a commit writes, so
it sits at the file's end. LMDB trusts a page's node sizes: a damaged node whose key or data
size reaches past the page makes it copy bytes from wherever that points, and past the file's
end the process dies with SIGBUS. The same holds for a value's node in a named database: one
damaged byte of its size (a value on overflow pages) makes a read of that value (py-lmdb
touches every page of it, even for a buffer) run past the file's end (found by the damage
fuzz). This walk reads the main database's pages and every named database's tree pages with
pread (never through the map; overflow pages, the values' bytes, are not read) and checks each
node lies inside its page, each child page, each named database's root and each value's
overflow pages inside the file. The format is mdb.c's (LMDB 0.9, 64-bit; see
`tiers._lmdb_pages`). Tree pages are a small part of a store (a 4 KiB leaf page holds the nodes
of ~80 values), so the walk reads a few MiB of a store of GiBs.

Without a read transaction a concurrent commit may reuse a page under the walk; the caller
reads the meta page again after the walk and trusts the answer only if no commit came between
(`tiers._lmdb_filecheck`).
"""

from __future__ import annotations

import os
import struct

from tiers._lmdb_pages import (
    _F_BIGDATA,
    _F_SUBDATA,
    _HEADER_BYTES,
    _INVALID_PAGE,
    _NODE_BYTES,
    _P_BRANCH,
    _P_LEAF,
    Meta,
)

__all__ = ["main_db_problem"]

_DB_RECORD_BYTES = 48  # MDB_db; md_root at 40


def main_db_problem(fd: int, meta: Meta, file_bytes: int) -> str:
    """Why LMDB cannot read `meta`'s main database and named databases within the file (""
    if it can)."""
    page_bytes = meta.page_bytes
    end_page = file_bytes // page_bytes
    if meta.main_root == _INVALID_PAGE:
        return ""
    main: list[int] = [meta.main_root]
    named: list[int] = []  # roots and pages of the named databases, walked after the main one
    seen: set[int] = set()
    while main or named:
        tree, pending = ("the main database", main) if main else ("a named database", named)
        number = pending.pop()
        if not 2 <= number < end_page:
            return f"{tree}'s page {number} lies outside the file ({end_page} pages)"
        if number in seen:
            return f"{tree} reaches page {number} twice (a cycle)"
        seen.add(number)
        page = os.pread(fd, page_bytes, number * page_bytes)
        problem = _page_problem(page, number, page_bytes, end_page, pending, named)
        if problem:
            return f"{tree}'s page {number} is damaged: {problem}"
    return ""


def _page_problem(
    page: bytes, number: int, page_bytes: int, end_page: int, pending: list[int], named: list[int]
) -> str:
    """Checks one tree page; its children go to `pending`, named databases' roots to `named`."""
    if len(page) < page_bytes:
        return "cut short"
    pgno, _, flags, lower, upper = struct.unpack_from("<QHHHH", page, 0)
    kind = flags & (_P_BRANCH | _P_LEAF)
    if pgno != number or kind not in (_P_BRANCH, _P_LEAF):
        return "not a tree page"
    if not _HEADER_BYTES <= lower <= upper <= page_bytes:
        return "its free space is out of bounds"
    count = (lower - _HEADER_BYTES) >> 1
    for offset in struct.unpack_from(f"<{count}H", page, _HEADER_BYTES):
        if not upper <= offset <= page_bytes - _NODE_BYTES:
            return "a node lies outside the page"
        lo, hi, node_flags, key_bytes = struct.unpack_from("<HHHH", page, offset)
        data_at = offset + _NODE_BYTES + key_bytes
        if kind == _P_BRANCH:
            child = lo | hi << 16 | node_flags << 32
            if data_at > page_bytes or not 2 <= child < end_page:
                return f"a branch node points outside the page or file (page {child})"
            pending.append(child)
            continue
        data_bytes = lo | hi << 16
        problem = _leaf_node_problem(page, data_at, data_bytes, node_flags, end_page, named)
        if problem:
            return problem
    return ""


def _leaf_node_problem(
    page: bytes, data_at: int, data_bytes: int, node_flags: int, end_page: int, named: list[int]
) -> str:
    page_bytes = len(page)
    if node_flags & _F_BIGDATA:  # the data is on overflow pages: its first page number here
        if data_at + 8 > page_bytes:
            return "a node's key runs past the page"
        (first,) = struct.unpack_from("<Q", page, data_at)
        num_pages = (_HEADER_BYTES - 1 + data_bytes) // page_bytes + 1  # OVPAGES
        if first < 2 or first + num_pages > end_page:
            return f"a node's data on pages {first}+{num_pages} lies outside the file"
        return ""
    if data_at + data_bytes > page_bytes:
        return "a node's key or data runs past the page"
    if node_flags & _F_SUBDATA:  # a named database's record: its root must be in the file
        if data_bytes != _DB_RECORD_BYTES:
            return f"a database record has {data_bytes} bytes"
        (root,) = struct.unpack_from("<Q", page, data_at + 40)
        if root != _INVALID_PAGE and not 2 <= root < end_page:
            return f"a named database's root (page {root}) lies outside the file"
        if root != _INVALID_PAGE:
            named.append(root)  # its tree is walked too
    return ""
