"""The disk-writer process's main: `python -m kvstore.diskwriter.child FD`.

FD is this end of a socket pair the engine made (`client.DiskWriterProcess`). The child reads
its `Setup`, lowers its priority, opens the store and maps the region, answers "ready", then
serves requests until end of input (the engine closed its end or died), when it syncs and
closes the store. It also asks Linux to end it with its parent (`PR_SET_PDEATHSIG`), for the
case where a forked process keeps the engine's end open.
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
from tiers.errors import StoreFullError, TierError
from tiers.lmdb import LMDBStore
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


def serve(conn: Connection, store: LMDBStore, rows: RegionView) -> None:
    """Answer requests until end of input."""
    while True:
        try:
            request = protocol.decode(conn.recv_bytes())
        except (EOFError, OSError):
            return
        try:
            answer = _answer(store, rows, request)
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
        store = LMDBStore.open(setup.store_path, capacity_bytes=setup.capacity_bytes, create=False)
        rows = RegionView.open(setup.region_path)
    except (TierError, OSError) as exc:
        conn.send_bytes(protocol.encode(["failed", str(exc)]))
        return 1
    conn.send_bytes(protocol.encode(["ready", os.getpid(), applied]))
    try:
        serve(conn, store, rows)
    finally:
        try:
            store.sync()
        finally:
            store.close()
            rows.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
