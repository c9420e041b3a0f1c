"""`DiskWriterProcess`: the engine's handle on its disk-writer child (see the package docstring).

Each call sends one request and waits for its answer (in C, without the GIL). Errors come back
as the store raised them: `StoreFullError`, `StoreIOError` (the disk failed, or the child ended
mid-request: nothing of that request is acknowledged), `DiskWriterError` (a defect in the child).
A child that ended is started again at the next call, up to `max_restarts` times; after that
every call fails with `StoreIOError`, so writes are failed and counted, never lost silently.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import kvstore
import tiers
from kvstore.diskwriter import protocol
from kvstore.errors import KVStoreError
from kvstore.keys import BlockKey
from tiers.errors import StoreFullError, StoreIOError

__all__ = ["DiskWriterError", "DiskWriterProcess"]

logger = logging.getLogger(__name__)

_STOP_TIMEOUT_S = 10.0


class DiskWriterError(KVStoreError):
    """The disk-writer child failed a request for a reason other than the disk (a defect)."""


@dataclass(slots=True)
class _Child:
    process: subprocess.Popen[bytes]
    conn: Connection
    applied: tuple[str, ...]


def _child_env() -> dict[str, str]:
    """This environment, with the directories kvstore and tiers were imported from first."""
    roots = dict.fromkeys(
        str(Path(package.__file__ or "").resolve().parent.parent) for package in (kvstore, tiers)
    )
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([*roots, *filter(None, [env.get("PYTHONPATH")])])
    return env


class DiskWriterProcess:
    """Threading: one caller at a time (the tier service's writer thread); a lock holds others."""

    def __init__(self, setup: protocol.Setup, *, start_timeout_s: float, max_restarts: int) -> None:
        self._setup = setup
        self._start_timeout_s = start_timeout_s
        self._max_restarts = max_restarts
        self._num_restarts = 0
        self._lock = threading.Lock()
        self._child: _Child | None = self._spawn()

    @classmethod
    def start(
        cls,
        *,
        store_path: str | os.PathLike[str],
        capacity_bytes: int,
        region_path: str | os.PathLike[str],
        lower_priority: bool = True,
        writemap: bool = True,
        start_timeout_s: float = 60.0,
        max_restarts: int = 3,
    ) -> DiskWriterProcess:
        """Start the child and wait until it has the store open (`StoreIOError` if it cannot).
        `writemap`: the child writes through LMDB's map (see `kvstore.diskwriter.child`)."""
        setup = protocol.Setup(
            str(store_path), capacity_bytes, str(region_path), lower_priority, writemap
        )
        return cls(setup, start_timeout_s=start_timeout_s, max_restarts=max_restarts)

    @property
    def pid(self) -> int | None:
        child = self._child
        return None if child is None else child.process.pid

    @property
    def applied_priority(self) -> tuple[str, ...]:
        """The priority steps the running child took (`priority.lower_priority`)."""
        child = self._child
        return () if child is None else child.applied

    # -- the store's write half ---------------------------------------------------------------

    def put_rows(self, namespace: str, items: Sequence[tuple[BlockKey, int]], now_s: float) -> int:
        pairs = [[key, row] for key, row in items]
        return int(self._call(["put", namespace, pairs, now_s]))

    def delete_many(self, namespace: str, keys: Sequence[bytes]) -> int:
        return int(self._call(["delete", namespace, list(keys)]))

    def touch_many(self, namespace: str, keys: Sequence[bytes], now_s: float) -> None:
        self._call(["touch", namespace, list(keys), now_s])

    def sync(self) -> None:
        self._call(["sync"])

    def close(self) -> None:
        """End the child: it syncs and closes the store at end of input (killed if it has not
        exited within 10 s)."""
        with self._lock:
            child, self._child = self._child, None
            self._num_restarts = self._max_restarts  # no restart after close
        if child is not None:
            _stop(child)

    # -- internals ------------------------------------------------------------------------------

    def _call(self, request: list[Any]) -> Any:
        with self._lock:
            child = self._child or self._restart()
            try:
                child.conn.send_bytes(protocol.encode(request))
                answer = protocol.decode(child.conn.recv_bytes())
            except (EOFError, OSError) as exc:
                self._child = None
                code = _stop(child)
                raise StoreIOError(
                    f"kvstore disk-writer process {child.process.pid} ended (exit code {code}) "
                    f"during a {request[0]!r}; nothing of it is acknowledged"
                ) from exc
        kind = answer[0]
        if kind == "ok":
            return answer[1]
        if kind == "full":
            raise StoreFullError(answer[1], requested_bytes=answer[2], free_bytes=answer[3])
        if kind == "io":
            raise StoreIOError(answer[1])
        raise DiskWriterError(f"kvstore disk-writer process failed a {request[0]!r}: {answer[1]}")

    def _restart(self) -> _Child:
        if self._num_restarts >= self._max_restarts:
            raise StoreIOError(
                f"kvstore disk-writer process is not running (restarted {self._num_restarts} "
                "times already); disk writes fail until the engine restarts"
            )
        self._num_restarts += 1
        logger.warning(
            "kvstore disk-writer process ended; starting it again (%d of %d)",
            self._num_restarts,
            self._max_restarts,
        )
        child = self._child = self._spawn()
        return child

    def _spawn(self) -> _Child:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            process = subprocess.Popen(
                [sys.executable, "-m", "kvstore.diskwriter.child", str(theirs.fileno())],
                pass_fds=(theirs.fileno(),),
                stdin=subprocess.DEVNULL,
                env=_child_env(),
            )
        except OSError as exc:
            ours.close()
            raise StoreIOError(f"cannot start the kvstore disk-writer process: {exc}") from exc
        finally:
            theirs.close()
        conn = Connection(ours.detach())
        child = _Child(process, conn, ())
        try:
            conn.send_bytes(protocol.encode(self._setup))
            if not conn.poll(self._start_timeout_s):
                raise TimeoutError(f"no answer within {self._start_timeout_s:.0f} s")
            answer = protocol.decode(conn.recv_bytes())
        except (EOFError, OSError) as exc:  # TimeoutError is an OSError
            code = _stop(child)
            raise StoreIOError(
                f"kvstore disk-writer process did not start (exit code {code}): {exc}"
            ) from exc
        if answer[0] != "ready":
            _stop(child)
            raise StoreIOError(f"kvstore disk-writer process did not start: {answer[1]}")
        child.applied = tuple(answer[2])
        logger.info(
            "kvstore disk-writer process %d serves %s (priority: %s)",
            process.pid,
            self._setup.store_path,
            ", ".join(child.applied) or "unchanged",
        )
        return child


def _stop(child: _Child) -> int | None:
    """Ask the child to sync and exit, close its input and wait for it (kill after 10 s); its
    exit code."""
    with contextlib.suppress(OSError, EOFError):
        child.conn.send_bytes(protocol.encode(["close"]))
        if child.conn.poll(_STOP_TIMEOUT_S):
            child.conn.recv_bytes()
    child.conn.close()
    try:
        return child.process.wait(_STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        logger.error("kvstore disk-writer process %d did not exit; killing it", child.process.pid)
        child.process.kill()
        return child.process.wait()
