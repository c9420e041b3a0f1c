"""Is a store's data file safe to map: not empty, and long enough for the pages it uses?

A file shorter than the pages a snapshot uses kills the reading process with SIGBUS (see
`tiers._lmdb_pages` for what "uses" means, from mdb.c). The check has two steps:

1. **Quick bound** (every transaction): read the newest meta page, *then* the file's size. A
   commit writes its pages before its meta page and the file never shrinks while LMDB uses it,
   so a size read after the meta covers every page that snapshot wrote; reading them the other
   way round paired an old size with a newer meta and flagged healthy stores. A file at least
   `(mm_last_pg + 1)` pages long is safe.
2. **Confirmation** (only when the file is shorter than that, which a healthy store without
   `writemap` is after about one commit in thousands: LMDB's loose pages): every page past the
   end must be on the snapshot's free list. Under an open store the snapshot is pinned by a
   read transaction (its pages cannot be reused while it is open), so the answer is exact; a
   short file that passed is remembered by `(mm_last_pg, size)` so it is walked once. Before
   the store is opened there is no pin: a finding counts only if three walks, a few ms apart,
   agree on the same snapshot, size and page (a concurrent commit changes one of them).

A finding says what was seen: the file's size, the page past its end and the transaction.

Before the store opens, the main database (the named databases' records, which opening reads)
is also walked: a damaged node there would send LMDB's reads past the file's end
(`tiers._lmdb_main_db`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass

from tiers._lmdb_main_db import main_db_problem
from tiers._lmdb_pages import (
    Meta,
    PageChanged,
    first_page_in_use_past_end,
    newest_meta,
    read_metas,
    unknown_format,
)

__all__ = ["DataFileCheck", "problem_before_open"]

logger = logging.getLogger(__name__)

_UNPINNED_AGREEING_WALKS = 3
_UNPINNED_ATTEMPTS = 8
_UNPINNED_PAUSE_S = 0.005
_PINNED_ATTEMPTS = 4

Pin = Callable[[], contextlib.AbstractContextManager[int]]
"""Opens a read transaction for the duration of the `with` and yields its txn id."""


def _quick(fd: int) -> tuple[str, Meta | None, int]:
    """(a definite problem or "", the newest meta, the size read after it)."""
    meta = newest_meta(fd)  # before the size: see the module docstring
    size = os.fstat(fd).st_size
    if size == 0:
        return "its data.mdb is empty (0 bytes)", None, size
    if meta is None:  # not an LMDB file: LMDB's open or its reads say so
        return "", None, size
    if size < 2 * meta.page_bytes:
        return f"its data.mdb has {size} bytes, less than its two meta pages (truncated)", None, 0
    return "", meta, size


def _finding(size: int, page: int, meta: Meta) -> str:
    return (
        f"its data.mdb has {size} bytes but page {page} (bytes {page * meta.page_bytes} to "
        f"{(page + 1) * meta.page_bytes}), which transaction {meta.txn_id} uses, lies past "
        "its end (truncated)"
    )


def problem_before_open(fd: int) -> str:
    """Why the data file behind `fd` cannot be mapped ("" if it can), with no read
    transaction to pin a snapshot (before LMDB opens it): a meta page naming a data format no
    LMDB writes, cut short, or a main database (which opening reads) that would send LMDB
    past the file's end."""
    version = unknown_format(fd)
    if version is not None:
        return f"its meta page names data format v{version}, which no LMDB writes (damaged)"
    return _truncation_before_open(fd) or _main_db_before_open(fd)


def _main_db_before_open(fd: int) -> str:
    """`tiers._lmdb_main_db`'s walk, trusted only if no commit came during it (the newest
    snapshot's pages are never rewritten while it is the newest)."""
    for _ in range(_UNPINNED_ATTEMPTS):
        meta = newest_meta(fd)
        if meta is None:
            return ""
        problem = main_db_problem(fd, meta, os.fstat(fd).st_size)
        again = newest_meta(fd)
        if again is not None and again.txn_id == meta.txn_id:
            return f"{problem} (transaction {meta.txn_id})" if problem else ""
        time.sleep(_UNPINNED_PAUSE_S)
    logger.info("main database check of fd %d did not settle (a busy writer?); deferred", fd)
    return ""


def _truncation_before_open(fd: int) -> str:
    problem, meta, size = _quick(fd)
    if problem or meta is None or size >= meta.needed_bytes:
        return problem
    seen: list[tuple[int, int, int]] = []
    for _ in range(_UNPINNED_ATTEMPTS):
        try:
            page = first_page_in_use_past_end(fd, meta, size)
        except PageChanged:
            page = -1
        if page is None:
            return ""
        if page >= 0:
            seen.append((meta.txn_id, size, page))
            if len(seen) >= _UNPINNED_AGREEING_WALKS and len(set(seen[-3:])) == 1:
                return _finding(size, page, meta)
        time.sleep(_UNPINNED_PAUSE_S)
        problem, next_meta, size = _quick(fd)
        if problem or next_meta is None or size >= next_meta.needed_bytes:
            return problem
        meta = next_meta
    logger.info("data file check of fd %d did not settle (a busy writer?); deferred", fd)
    return ""


@dataclass(slots=True)
class DataFileCheck:
    """The check under an open store (one per shared environment; not thread-safe on its own:
    at worst two threads both confirm the same short file)."""

    fd: int
    accepted: tuple[int, int] | None = None
    """`(mm_last_pg, size)` of a short file whose pages past the end were all free."""

    def problem(self, pin: Pin) -> str:
        """Why the file cannot be mapped now ("" if it can); `pin` confirms a short file."""
        problem, meta, size = _quick(self.fd)
        if problem or meta is None or size >= meta.needed_bytes:
            return problem
        if self.accepted == (meta.last_page, size):
            return ""
        return self._confirm(pin)

    def _confirm(self, pin: Pin) -> str:
        for _ in range(_PINNED_ATTEMPTS):
            with pin() as txn_id:
                meta = next((m for m in read_metas(self.fd) if m.txn_id == txn_id), None)
                size = os.fstat(self.fd).st_size
                if meta is None:  # two newer commits rewrote its meta page: pin a newer one
                    continue
                if size >= meta.needed_bytes:
                    return ""
                try:
                    page = first_page_in_use_past_end(self.fd, meta, size)
                except PageChanged as exc:  # pinned pages do not change: a damaged free list
                    logger.warning("cannot check the data file's length: %s", exc)
                    return ""
            if page is not None:
                return _finding(size, page, meta)
            self.accepted = (meta.last_page, size)
            return ""
        return ""
