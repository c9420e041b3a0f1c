"""The CPU region's backing file: header format, atomic publication and stale-file reclaim.

See `tiers.cpu` for the file layout. Everything here works on paths and raw mappings; the
`CPURegion` class owns the mapping's lifetime.
"""

from __future__ import annotations

import contextlib
import logging
import mmap
import os
import shutil
import struct
from dataclasses import dataclass
from pathlib import Path

from tiers.errors import RegionError, TierConfigError

__all__ = [
    "DEFAULT_REGION_DIRECTORY",
    "HEADER_STRUCT",
    "PAGE_BYTES",
    "REGION_FORMAT_VERSION",
    "RegionHeader",
    "is_owner_alive",
    "map_shared",
    "publish",
    "reclaim_stale_regions",
    "region_path",
    "round_up",
]

logger = logging.getLogger(__name__)

DEFAULT_REGION_DIRECTORY = Path("/dev/shm")
PAGE_BYTES = 4096
MAGIC = b"KVSTREG\0"
REGION_FORMAT_VERSION = 1
HEADER_STRUCT = struct.Struct("<8sIIqQQQd")


@dataclass(frozen=True, slots=True)
class RegionHeader:
    """The region file's header page."""

    format_version: int
    owner_pid: int
    num_rows: int
    row_bytes: int
    row_stride_bytes: int
    created_s: float

    def pack(self) -> bytes:
        return HEADER_STRUCT.pack(
            b"\0" * 8, self.format_version, PAGE_BYTES, self.owner_pid, self.num_rows,
            self.row_bytes, self.row_stride_bytes, self.created_s,
        )  # fmt: skip

    @classmethod
    def unpack(cls, data: bytes, path: Path) -> RegionHeader:
        if len(data) < HEADER_STRUCT.size:
            raise RegionError(f"region file {path} is too short for a header ({len(data)} bytes)")
        magic, version, header_bytes, pid, num_rows, row_bytes, stride, created_s = (
            HEADER_STRUCT.unpack_from(data)
        )
        if magic != MAGIC:
            raise RegionError(f"region file {path} has no valid header (magic {magic!r})")
        if version != REGION_FORMAT_VERSION or header_bytes != PAGE_BYTES:
            raise RegionError(
                f"region file {path} has format version {version}; expected {REGION_FORMAT_VERSION}"
            )
        return cls(version, pid, num_rows, row_bytes, stride, created_s)

    @property
    def file_bytes(self) -> int:
        return PAGE_BYTES + self.num_rows * self.row_stride_bytes


def round_up(value: int, multiple: int) -> int:
    return (value + multiple - 1) // multiple * multiple


def region_path(name: str, directory: str | os.PathLike[str]) -> Path:
    """The file backing region `name`; the name must be a plain file name."""
    if not name or "/" in name or name in {".", ".."} or "\0" in name:
        raise TierConfigError(f"region name {name!r} must be a non-empty file name without '/'")
    folder = Path(directory)
    if not folder.is_dir():
        raise TierConfigError(f"region directory {folder} does not exist or is not a directory")
    return folder / name


def is_owner_alive(pid: int, created_s: float) -> bool:
    """True if process `pid` exists and is not a younger process that reused the pid."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    started_s = _process_start_s(pid)
    return started_s is None or started_s <= created_s + 1.0


def _process_start_s(pid: int) -> float | None:
    """Start time of `pid` in epoch seconds from /proc, or None where /proc cannot tell."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        start_ticks = int(stat.rsplit(")", 1)[1].split()[19])
        boot_line = next(
            line for line in Path("/proc/stat").read_text().splitlines() if line.startswith("btime")
        )
        return int(boot_line.split()[1]) + start_ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return None


def publish(path: Path, header: RegionHeader) -> mmap.mmap:
    """Build the region in a private temp file, then link it into place atomically.

    `os.link` fails if `path` exists, so a visible region file always has a complete header; an
    existing file is reclaimed once if its owner is dead.
    """
    temp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        fd = os.open(temp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.ftruncate(fd, header.file_bytes)
            _reserve(fd, path, header.file_bytes)
            mapping = map_shared(fd, header.file_bytes)
        finally:
            os.close(fd)
        mapping[8 : HEADER_STRUCT.size] = header.pack()[8:]
        mapping[:8] = MAGIC
        try:
            _link_exclusive(temp, path)
        except BaseException:
            mapping.close()
            raise
        return mapping
    except OSError as exc:
        raise RegionError(
            f"cannot create CPU region {path} ({header.file_bytes} bytes): {exc}"
        ) from exc
    finally:
        temp.unlink(missing_ok=True)


def map_shared(fd: int, size_bytes: int) -> mmap.mmap:
    """Map `fd` shared, with its page tables populated up front where Linux allows, so copies
    into the region never take page faults."""
    return mmap.mmap(fd, size_bytes, mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0))


def _reserve(fd: int, path: Path, size_bytes: int) -> None:
    """Allocate the file's memory now: a region larger than the free space fails here with a
    clear error instead of a SIGBUS on some later write."""
    try:
        os.posix_fallocate(fd, 0, size_bytes)
    except OSError as exc:
        usage = shutil.disk_usage(path.parent)
        raise RegionError(
            f"cannot reserve {size_bytes} bytes for CPU region {path}: {exc.strerror}; "
            f"{usage.free} bytes are free in {path.parent}"
        ) from exc


def _link_exclusive(temp: Path, path: Path) -> None:
    for _attempt in range(2):
        try:
            os.link(temp, path)
            return
        except FileExistsError:
            _reclaim_if_stale(path)
    raise RegionError(f"CPU region {path} reappeared while being reclaimed; another process races")


def _reclaim_if_stale(path: Path, *, remove_unreadable: bool = True) -> bool:
    """Remove `path` if its owner is dead; raise RegionError if the owner is alive. A file
    without a readable header is removed only if `remove_unreadable`. True if removed."""
    try:
        with path.open("rb") as file:
            header = RegionHeader.unpack(file.read(HEADER_STRUCT.size), path)
    except (RegionError, OSError) as exc:
        if not remove_unreadable:
            return False
        logger.warning("removing unreadable CPU region %s: %s", path, exc)
    else:
        if is_owner_alive(header.owner_pid, header.created_s):
            raise RegionError(
                f"CPU region {path} is in use by live process {header.owner_pid}; stop it or "
                "choose another region name"
            )
        logger.warning(
            "removing stale CPU region %s left by dead process %d", path, header.owner_pid
        )
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    return True


def reclaim_stale_regions(
    directory: str | os.PathLike[str] = DEFAULT_REGION_DIRECTORY, *, prefix: str = ""
) -> list[Path]:
    """Remove region files named `prefix*` whose owner is dead, and temp files of dead creators;
    returns the removed paths. Live owners' regions and files that are not regions stay."""
    folder = Path(directory)
    if not folder.is_dir():
        raise TierConfigError(f"region directory {folder} does not exist or is not a directory")
    removed: list[Path] = []
    for path in sorted(folder.glob(f"{prefix}*")) + sorted(folder.glob(f".{prefix}*.tmp")):
        if not path.is_file():
            continue
        if path.name.startswith("."):
            pid_text = path.name.removesuffix(".tmp").rsplit(".", 1)[-1]
            if pid_text.isdigit() and not is_owner_alive(int(pid_text), float("inf")):
                path.unlink(missing_ok=True)
                removed.append(path)
            continue
        with contextlib.suppress(RegionError):
            if _reclaim_if_stale(path, remove_unreadable=False):
                removed.append(path)
    return removed
