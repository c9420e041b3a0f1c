"""Opening LMDB environments for `LMDBStore`: path checks, one shared environment per path and
process, and the gate that keeps map resizes away from live read transactions.

LMDB forbids opening one environment twice in a process (closing either copy drops the other's
POSIX locks), so stores opened on the same path in one process share a refcounted `SharedEnv`.
`mdb_env_set_mapsize` remaps the file, so it must never run while a read transaction of this
process is live: readers enter `ReadGate.reading()`, and a resize waits for them to leave.

LMDB reads through a memory map, so a data file truncated under the open store would kill the
process with SIGBUS on the next read. Every transaction therefore first checks that the file
is still the one that was opened and still holds every page the store uses
(`tiers._lmdb_filecheck`: exact, with no false findings on a healthy store); once it is not,
every operation raises StoreIOError (the race with a truncation during a transaction remains).
Any other LMDB error inside a transaction (a full or failing disk, a damaged page) is raised as
StoreIOError; `MapFullError` passes through for `LMDBStore.put_many` to grow the map.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lmdb

from tiers._lmdb_filecheck import DataFileCheck, problem_before_open
from tiers._lmdb_reserve import SLACK_BYTES, DiskReservation
from tiers.errors import StoreDamagedError, StoreIOError, TierConfigError

__all__ = ["DB_NAMES", "LMDBOptions", "ReadGate", "SharedEnv", "acquire", "release"]

logger = logging.getLogger(__name__)

DB_NAMES = (b"store", b"namespaces", b"counts", b"data", b"meta")
_STORE_FILES = {"data.mdb", "lock.mdb"}
_RESIZE_TIMEOUT_S = 5.0


@dataclass(frozen=True, slots=True)
class LMDBOptions:
    """LMDB environment flags (the defaults and why: see `tiers.lmdb`)."""

    sync: bool = True
    metasync: bool = False
    writemap: bool = False
    map_async: bool = False
    readahead: bool = True
    max_readers: int = 1024


class ReadGate:
    """Any number of read transactions, or one map resize, never both at once."""

    def __init__(self) -> None:
        self._condition = threading.Condition()
        self._num_readers = 0
        self._is_resizing = False

    @contextlib.contextmanager
    def reading(self) -> Iterator[None]:
        with self._condition:
            self._condition.wait_for(lambda: not self._is_resizing)
            self._num_readers += 1
        try:
            yield
        finally:
            with self._condition:
                self._num_readers -= 1
                self._condition.notify_all()

    def run_exclusive(self, action: Callable[[], None], timeout_s: float) -> bool:
        """Run `action` with no reader inside; False (action not run) if readers stay past
        `timeout_s`."""
        with self._condition:
            if self._is_resizing:
                return False
            self._is_resizing = True
            try:
                if not self._condition.wait_for(lambda: self._num_readers == 0, timeout_s):
                    return False
                action()
                return True
            finally:
                self._is_resizing = False
                self._condition.notify_all()


@dataclass(slots=True)
class SharedEnv:
    """One open environment, shared by every `LMDBStore` of this process on the same path."""

    path: Path
    env: lmdb.Environment
    dbs: dict[bytes, lmdb._Database]
    options: LMDBOptions
    is_readonly: bool
    gate: ReadGate
    data_fd: int = -1
    page_bytes: int = 4096
    file_check: DataFileCheck | None = None
    broken: str = ""
    num_users: int = 0
    reservation: DiskReservation | None = None  # a writemap writer's (`tiers._lmdb_reserve`)

    @contextlib.contextmanager
    def write_txn(self, *, new_bytes: int = 0) -> Iterator[lmdb.Transaction[bytes]]:
        """A write transaction, committed on success and aborted on an exception; `new_bytes`:
        the bytes of pages it may add (with `writemap`, allocated on disk before it begins)."""
        self.check_file()
        try:
            for attempt in range(2):
                try:
                    txn = self.env.begin(write=True)
                    break
                except lmdb.MapResizedError:
                    if attempt or not self.adopt_map_size():
                        raise
            with txn:
                if self.reservation is not None:  # under the write lock: LMDB's last page now
                    self._reserve(self.reservation, new_bytes)
                yield txn
        except lmdb.MapFullError:
            raise
        except lmdb.Error as exc:
            raise StoreIOError(f"LMDB write to store {self.path} failed: {exc}") from exc

    def _reserve(self, reservation: DiskReservation, new_bytes: int) -> None:
        info = self.env.info()
        end = (info["last_pgno"] + 1) * self.page_bytes + new_bytes + SLACK_BYTES
        try:
            reservation.ensure(end, info["map_size"])
        except OSError as exc:
            raise StoreIOError(
                f"cannot allocate disk blocks for a write to store {self.path}: {exc}"
            ) from exc

    @contextlib.contextmanager
    def read_txn(self, *, buffers: bool = False) -> Iterator[lmdb.Transaction[Any]]:
        """A read transaction inside the gate; adopts a map another process grew."""
        self.check_file()
        with self._unchecked_read_txn(buffers=buffers) as txn:
            yield txn

    @contextlib.contextmanager
    def _unchecked_read_txn(self, *, buffers: bool) -> Iterator[lmdb.Transaction[Any]]:
        try:
            for attempt in range(2):
                with self.gate.reading():
                    try:
                        txn = self.env.begin(buffers=True) if buffers else self.env.begin()
                    except lmdb.MapResizedError:
                        if attempt:
                            raise
                    else:
                        try:
                            yield txn
                        finally:
                            txn.abort()
                        return
                self.adopt_map_size()
        except lmdb.Error as exc:
            raise StoreIOError(f"LMDB read of store {self.path} failed: {exc}") from exc

    def check_file(self) -> None:
        """Raise StoreIOError if the data file was truncated or replaced under the open store
        (reading its map would then kill the process with SIGBUS, or read another file)."""
        if not self.broken:
            self.broken = self._file_problem()
        if self.broken:
            raise StoreIOError(
                f"store {self.path} is unusable: {self.broken}; reopen it (and check it with "
                f"`kvstore verify {self.path}`)"
            )

    def _file_problem(self) -> str:
        if self.data_fd < 0:
            return ""
        opened = os.fstat(self.data_fd)
        try:
            current = os.stat(self.path / "data.mdb")
        except OSError as exc:
            return f"its data.mdb is gone ({exc.strerror})"
        if (current.st_dev, current.st_ino) != (opened.st_dev, opened.st_ino):
            return "its data.mdb was replaced by another file"
        if self.file_check is None:
            self.file_check = DataFileCheck(self.data_fd)
        return self.file_check.problem(self._pinned_txn_id)

    @contextlib.contextmanager
    def _pinned_txn_id(self) -> Iterator[int]:
        """A read transaction's id: its snapshot's pages cannot be reused while it is open.
        Beginning one reads only the two meta pages, which the quick check saw in the file."""
        with self._unchecked_read_txn(buffers=False) as txn:
            yield int(txn.id())

    def adopt_map_size(self) -> bool:
        """Adopt the map size another process grew the environment to."""
        return self.gate.run_exclusive(lambda: self.env.set_mapsize(0), _RESIZE_TIMEOUT_S)

    def grow_map(self, limit_bytes: int) -> bool:
        """Grow the map by half (up to `limit_bytes`); False if at the limit or readers stay."""
        current = self.env.info()["map_size"]
        if current >= limit_bytes:
            return False
        new_size = min(limit_bytes, current * 3 // 2)
        grown = self.gate.run_exclusive(lambda: self.env.set_mapsize(new_size), _RESIZE_TIMEOUT_S)
        if grown:
            logger.warning("grew LMDB map of %s from %d to %d bytes", self.path, current, new_size)
        return grown


_registry: dict[Path, SharedEnv] = {}
_registry_lock = threading.Lock()


def check_store_path(path: Path, *, create: bool, readonly: bool) -> Path:
    """Validate (and when allowed, create with mode 0700) the store directory."""
    if path.exists() and not path.is_dir():
        raise TierConfigError(f"store path {path} is a file; expected a store directory")
    if path.is_dir():
        needed = os.R_OK | os.X_OK | (0 if readonly else os.W_OK)
        if not os.access(path, needed):
            raise TierConfigError(
                f"no permission to {'read' if readonly else 'read and write'} store directory "
                f"{path}"
            )
        if (path / "data.mdb").is_file():
            return path.resolve()
        is_opening = not create or readonly
        if (path / "data.mdb").exists() or (is_opening and (path / "lock.mdb").is_file()):
            raise StoreDamagedError(
                f"store {path} has lost its data file (data.mdb is missing or not a file); "
                "move the directory aside"
            )
        if is_opening:
            raise TierConfigError(f"{path} is not a kvstore store (it has no data.mdb)")
        if any(entry.name not in _STORE_FILES for entry in path.iterdir()):
            raise TierConfigError(
                f"{path} is a non-empty directory without a store; give an empty or new directory"
            )
        _make_private(path)
        return path.resolve()
    if not create or readonly:
        raise TierConfigError(f"store directory {path} does not exist (and create is off)")
    return _make_directory(path)


def _make_private(path: Path) -> None:
    """An existing directory that becomes a store gets mode 0700, as a new one would."""
    try:
        path.chmod(0o700)
    except OSError as exc:
        logger.warning("cannot make store directory %s private (mode 0700): %s", path, exc)


def _make_directory(path: Path) -> Path:
    parent = path.parent
    if not parent.is_dir():
        raise TierConfigError(f"cannot create store {path}: parent {parent} does not exist")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise TierConfigError(f"cannot create store {path}: no write permission on {parent}")
    try:
        path.mkdir(mode=0o700)
        path.chmod(0o700)
    except OSError as exc:
        raise TierConfigError(f"cannot create store directory {path}: {exc}") from exc
    logger.info("created store directory %s", path)
    return path.resolve()


def acquire(
    path: Path,
    *,
    readonly: bool,
    options: LMDBOptions,
    map_size_bytes: int,
) -> SharedEnv:
    """The shared environment for `path` (already checked), opening it on first use."""
    with _registry_lock:
        shared = _registry.get(path)
        if shared is None:
            shared = _open(path, readonly=readonly, options=options, map_size_bytes=map_size_bytes)
            _registry[path] = shared
        elif shared.is_readonly and not readonly:
            raise TierConfigError(
                f"store {path} is already open read-only in this process; close it before "
                "opening it for writing"
            )
        elif not readonly and shared.options != options:
            raise TierConfigError(
                f"store {path} is already open in this process with {shared.options}; "
                f"cannot reopen it with {options}"
            )
        shared.num_users += 1
        return shared


def release(shared: SharedEnv) -> None:
    with _registry_lock:
        shared.num_users -= 1
        if shared.num_users > 0:
            return
        _registry.pop(shared.path, None)
        shared.env.close()
        _close_fd(shared.data_fd)
        if shared.reservation is not None:
            shared.reservation.close()


_UNREADABLE = (
    lmdb.InvalidError,
    lmdb.CorruptedError,
    lmdb.VersionMismatchError,
    lmdb.PageNotFoundError,
    lmdb.PanicError,
    lmdb.BadRslotError,
)
"""LMDB's errors for a file that exists but is not a readable LMDB environment."""


def _open(path: Path, *, readonly: bool, options: LMDBOptions, map_size_bytes: int) -> SharedEnv:
    data_fd = _checked_data_file(path, readonly=readonly)
    try:
        env = _open_env(path, readonly=readonly, options=options, map_size_bytes=map_size_bytes)
    except BaseException:
        _close_fd(data_fd)
        raise
    try:
        dbs = _open_dbs(env, path, readonly=readonly)
        if data_fd < 0:  # a new store: LMDB just created the file
            data_fd = os.open(path / "data.mdb", os.O_RDONLY | os.O_CLOEXEC)
        page_bytes = int(env.stat()["psize"])
        writemap = options.writemap and not readonly
        reservation = DiskReservation(path / "data.mdb") if writemap else None
    except BaseException as exc:
        env.close()
        _close_fd(data_fd)
        _raise_open_error(path, exc)
        raise
    return SharedEnv(
        path, env, dbs, options, readonly, ReadGate(), data_fd, page_bytes,
        reservation=reservation,
    )  # fmt: skip


def _open_env(
    path: Path, *, readonly: bool, options: LMDBOptions, map_size_bytes: int
) -> lmdb.Environment:
    try:
        return lmdb.open(
            str(path),
            map_size=map_size_bytes,
            subdir=True,
            readonly=readonly,
            create=False,
            mode=0o600,
            lock=True,
            max_dbs=len(DB_NAMES) + 1,
            max_readers=options.max_readers,
            sync=options.sync,
            metasync=options.metasync,
            writemap=options.writemap,
            map_async=options.map_async,
            readahead=options.readahead,
        )
    except BaseException as exc:
        _raise_open_error(path, exc)
        raise


def _raise_open_error(path: Path, exc: BaseException) -> None:
    """Raise the store error for `exc` met while opening `path`; return for anything else."""
    if isinstance(exc, _UNREADABLE):
        raise StoreDamagedError(
            f"store {path} cannot be read: {exc}; move it aside (the engine then starts a new "
            "store)"
        ) from exc
    if isinstance(exc, (lmdb.Error, OSError)):
        raise TierConfigError(f"cannot open LMDB store {path}: {exc}") from exc


def _checked_data_file(path: Path, *, readonly: bool) -> int:
    """An fd of the existing data file (-1 for a new store), checked before LMDB maps it: a
    truncated file would kill the process with SIGBUS on the first read of the map."""
    try:
        fd = os.open(path / "data.mdb", os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return -1
    except OSError as exc:
        raise TierConfigError(f"cannot open LMDB store {path}: {exc}") from exc
    problem = problem_before_open(fd)
    if problem:  # an empty file too: LMDB would make a new store over it, for writers only
        os.close(fd)
        raise StoreDamagedError(
            f"store {path} cannot be opened: {problem}; move it aside (the engine then starts "
            "a new store)"
        )
    return fd


def _close_fd(fd: int) -> None:
    if fd >= 0:
        os.close(fd)


def _open_dbs(env: lmdb.Environment, path: Path, *, readonly: bool) -> dict[bytes, lmdb._Database]:
    with env.begin() as txn:
        foreign = [key for key, _ in txn.cursor() if key not in DB_NAMES]
    if foreign:
        raise TierConfigError(
            f"{path} is an LMDB environment but not a kvstore store (it has databases "
            f"{foreign[:5]})"
        )
    try:
        # Without a caller's transaction: py-lmdb then keeps the handles of a read-only open.
        return {name: env.open_db(name, create=not readonly) for name in DB_NAMES}
    except lmdb.NotFoundError as exc:
        raise TierConfigError(f"{path} is not a kvstore store (missing databases)") from exc
