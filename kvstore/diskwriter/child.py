"""The disk-writer process's main: `python -m kvstore.diskwriter.child FD`.

FD is this end of a socket pair the engine made (`client.DiskWriterProcess`). The child reads
its `Setup`, lowers its priority, opens the store and maps the region, answers "ready", then
serves requests until end of input (the engine closed its end or died), when it syncs and
closes the store. It also asks Linux to end it with its parent (`PR_SET_PDEATHSIG`), for the
case where a forked process keeps the engine's end open.

**writemap.** The child opens the store with LMDB's `writemap` (values copied straight into the
shared map, no readahead on it): while the store's file grows that took 35-50% less CPU per
committed batch than `pwrite` (benchmarks/README, nohit: "The disk writer through LMDB's map"),
and the CPU the writer uses is taken from the engine on a busy machine. Only this child maps the
file writable; the engine's process and the CLI keep plain writes, which on Linux share the one
page cache with it. Disk blocks for every page a write can touch are allocated before LMDB
stores into them (`tiers._lmdb_reserve`), so a full filesystem fails the request instead of
killing the child with SIGBUS; the child then reopens the store without `writemap` and answers
the request with plain writes, which can still use the free pages inside the file, for the rest
of its life. (Were the child killed anyway, the engine starts another: `client`.)
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import signal
import sys
from collections.abc import Sequence
from multiprocessing.connection import Connection
from typing import Any

from kvstore.diskwriter import protocol
from kvstore.diskwriter.priority import lower_priority
from tiers.errors import StoreFullError, StoreNoSpaceError, TierError
from tiers.lmdb import LMDBOptions, LMDBStore
from tiers.region_view import RegionView

__all__ = ["main", "serve"]

logger = logging.getLogger("kvstore.diskwriter")

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except OSError:  # not Linux: end of input still ends the child
        pass


_WRITEMAP = LMDBOptions(writemap=True, readahead=False)


class _Writer:
    """The child's store: opened with `writemap` if asked, reopened without it the first time
    the filesystem has no room for a write's pages."""

    def __init__(self, setup: protocol.Setup) -> None:
        self._setup = setup
        self.store = self._open(writemap=setup.writemap)

    def _open(self, *, writemap: bool) -> LMDBStore:
        return LMDBStore.open(
            self._setup.store_path,
            capacity_bytes=self._setup.capacity_bytes,
            create=False,
            options=_WRITEMAP if writemap else None,
        )

    def answer(self, rows: RegionView, request: Sequence[Any]) -> list[Any]:
        try:
            return _answer(self.store, rows, request)
        except StoreNoSpaceError as exc:
            if not self.store.options.writemap:
                raise
            logger.warning(
                "kvstore disk writer: %s; writing without writemap from now on (free pages "
                "inside the store can still be used)",
                exc,
            )
            self.store.close()
            self.store = self._open(writemap=False)
            return _answer(self.store, rows, request)

    def close(self) -> None:
        try:
            self.store.sync()
        finally:
            self.store.close()


def _answer(store: LMDBStore, rows: RegionView, request: Sequence[Any]) -> list[Any]:
    op = request[0]
    if op == "put":
        _, namespace, pairs, now_s = request
        items = [(bytes(key), rows.row(row)) for key, row in pairs]
        return ["ok", store.put_many(namespace, items, now_s=now_s)]
    if op == "delete":
        return ["ok", store.delete_many(request[1], [bytes(key) for key in request[2]])]
    if op == "touch":
        store.touch_many(request[1], [bytes(key) for key in request[2]], now_s=request[3])
        return ["ok", None]
    if op in ("sync", "close"):
        store.sync()
        return ["ok", None]
    raise ValueError(f"unknown disk-writer request {op!r}")


def serve(conn: Connection, writer: _Writer, rows: RegionView) -> None:
    """Answer requests until end of input."""
    while True:
        try:
            request = protocol.decode(conn.recv_bytes())
        except (EOFError, OSError):
            return
        try:
            answer = writer.answer(rows, request)
        except StoreFullError as exc:
            answer = ["full", str(exc), exc.requested_bytes, exc.free_bytes]
        except (TierError, OSError) as exc:
            answer = ["io", str(exc)]
        except Exception as exc:
            logger.exception("kvstore disk writer: request %r failed", request[0])
            answer = ["bug", f"{type(exc).__name__}: {exc}"]
        try:
            conn.send_bytes(protocol.encode(answer))
        except OSError:
            return
        if request[0] == "close":
            return


def main(argv: Sequence[str]) -> int:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    _die_with_parent()
    conn = Connection(int(argv[1]))
    setup = protocol.decode_setup(conn.recv_bytes())
    applied = lower_priority() if setup.lower_priority else []
    try:
        writer = _Writer(setup)
    except (TierError, OSError) as exc:
        conn.send_bytes(protocol.encode(["failed", str(exc)]))
        return 1
    try:
        rows = RegionView.open(setup.region_path)
    except (TierError, OSError) as exc:
        writer.close()
        conn.send_bytes(protocol.encode(["failed", str(exc)]))
        return 1
    conn.send_bytes(protocol.encode(["ready", os.getpid(), applied]))
    try:
        serve(conn, writer, rows)
    finally:
        try:
            writer.close()
        finally:
            rows.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
