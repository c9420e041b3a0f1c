"""Plumbing shared by the store commands: opening stores, one-line errors, JSON, sizes and times.

Exit codes (every command): `EXIT_OK` 0; `EXIT_FAILURE` 1, an operational failure (corruption
found and not repaired, a store that cannot be read, a Redis server that cannot be reached, a
write that failed); `EXIT_USAGE` 2, bad input (a bad option, a path that is not a store, a bad
Redis URL or refused password, a store of an incompatible format version, an unknown namespace,
a key prefix that matches no chunk or several).

Read commands open the store read-only: LMDB readers never block a live engine writing it, and
the store's scans read in short batched transactions. Writing commands (`rm`, `gc`, `verify
--repair`) open it for writing with the capacity and map size the engine recorded, so they change
nothing but the entries they delete.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import lmdb
import typer
from rich.console import Console
from rich.markup import escape

from kvstore.errors import ConfigError, KeyLookupError, KVStoreError, StoreNotFoundError
from tiers.errors import NamespaceError, TierConfigError, TierError

if TYPE_CHECKING:
    from tiers.lmdb import LMDBStore

__all__ = [
    "EXIT_FAILURE",
    "EXIT_OK",
    "EXIT_USAGE",
    "SHORT_KEY_CHARS",
    "UsageError",
    "cli_errors",
    "confirm",
    "emit_json",
    "err_console",
    "format_bytes",
    "iso_time",
    "open_store",
    "parse_size_option",
    "relative_time",
    "short_key",
]

EXIT_OK, EXIT_FAILURE, EXIT_USAGE = 0, 1, 2


class UsageError(KVStoreError):
    """Bad command-line input the other kvstore errors do not name (exit 2)."""


def err_console() -> Console:
    """The console for diagnostics and progress bars: stderr, so stdout stays clean."""
    return Console(stderr=True, soft_wrap=True, highlight=False)


def fail(message: str, code: int) -> NoReturn:
    """Print `error: message` as one line on stderr and exit with `code`."""
    line = " ".join(message.split())
    err_console().print(f"[red]error:[/red] {escape(line)}")
    raise typer.Exit(code)


@contextmanager
def cli_errors() -> Iterator[None]:
    """Turn the expected errors into one line on stderr and an exit code (no traceback)."""
    try:
        yield
    except (UsageError, ConfigError, StoreNotFoundError, KeyLookupError) as exc:
        fail(str(exc), EXIT_USAGE)
    except (TierError, KVStoreError, lmdb.Error, OSError) as exc:
        fail(str(exc) or type(exc).__name__, EXIT_FAILURE)


def emit_json(document: Any) -> None:
    """Print exactly one JSON document on stdout (NaN and infinities become null; bytes and
    other values JSON cannot hold, such as a damaged descriptor may contain, become strings)."""
    typer.echo(json.dumps(_json_safe(document), indent=2, allow_nan=False))


def _json_key(key: Any) -> Any:
    if isinstance(key, str | int) or key is None:
        return key
    if isinstance(key, float) and math.isfinite(key):
        return key
    return repr(key)


def _json_safe(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {_json_key(key): _json_safe(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(item) for item in value]
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value).hex()
    if value is None or isinstance(value, str | int | float):
        return value
    return repr(value)


# -- stores -----------------------------------------------------------------------------------


def open_store(path: Path, *, writable: bool = False) -> LMDBStore:
    """Open the store at `path` without creating anything.

    Raises StoreNotFoundError for a path that is not a store, UsageError for a store of an
    incompatible format version, StoreDamagedError (exit 1) for a store LMDB cannot read.
    """
    from tiers.lmdb import LMDBStore, default_map_size_bytes  # not needed for `--help`

    if not path.exists():
        raise StoreNotFoundError(f"{path} does not exist; expected a store directory")
    try:
        store = LMDBStore.open(path, readonly=True, create=False)
    except NamespaceError as exc:
        raise UsageError(str(exc)) from exc
    except TierConfigError as exc:
        raise StoreNotFoundError(str(exc)) from exc
    if not writable:
        return store
    stats = store.stats()
    store.close()  # one process may not hold a path read-only and writable at once
    capacity_bytes = stats.capacity_bytes or max(stats.used_bytes, 1)
    # The writer's map size (with writemap the file is as large as its map), never smaller.
    file_size = (store.path / "data.mdb").stat().st_size
    map_size_bytes = max(default_map_size_bytes(capacity_bytes), file_size, stats.map_size_bytes)
    return LMDBStore.open(
        path, capacity_bytes=capacity_bytes, create=False, map_size_bytes=map_size_bytes
    )


# -- keys -------------------------------------------------------------------------------------

SHORT_KEY_CHARS = 16  # hex digits: 64 bits tell a store's chunks apart


def short_key(key: bytes) -> str:
    """A chunk key as tables and messages show it: 16 hex digits, never fewer (a table that
    lacks room wraps its other columns, see `_describe.new_table`)."""
    return key.hex()[:SHORT_KEY_CHARS]


# -- confirmation -----------------------------------------------------------------------------


def is_interactive() -> bool:
    return sys.stdin.isatty()


def confirm(action: str, *, yes: bool) -> None:
    """Return if `yes` or the user agrees to `action` (e.g. "delete 3 chunks") on a terminal;
    refuse (exit 2) when stdin is not a terminal, exit 1 if the user says no."""
    if yes:
        return
    if not is_interactive():
        raise UsageError(f"refusing to {action} without --yes (stdin is not a terminal)")
    if not typer.confirm(f"{action[:1].upper()}{action[1:]}?", default=False, err=True):
        err_console().print("aborted; nothing was deleted")
        raise typer.Exit(EXIT_FAILURE)


# -- sizes and times --------------------------------------------------------------------------


def parse_size_option(option: str, text: str) -> int:
    """A non-negative byte size from a string like "512MiB"; ConfigError names the option."""
    from kvstore.config import parse_size

    size = parse_size(option, text)
    if size < 0:
        raise ConfigError(f"{option}: expected a size >= 0, got {text!r}")
    return size


def format_bytes(size: float) -> str:
    """1536 -> "1.5 KiB"."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(size) < 1024 or unit == "TiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")  # pragma: no cover


def iso_time(epoch_s: float | None) -> str | None:
    """Epoch seconds as ISO 8601 in UTC (None, and a time no date can show, give None)."""
    if epoch_s is None:
        return None
    try:
        return datetime.fromtimestamp(epoch_s, tz=UTC).isoformat(timespec="seconds")
    except (ValueError, OverflowError, OSError):  # NaN, infinite or years past 9999
        return None


@dataclass(frozen=True, slots=True)
class _Span:
    seconds: float
    unit: str


_SPANS = (
    _Span(365 * 86400, "y"),
    _Span(86400, "d"),
    _Span(3600, "h"),
    _Span(60, "m"),
    _Span(1, "s"),
)


def relative_time(epoch_s: float | None, now_s: float) -> str:
    """`"3m ago"`, `"2d ago"`, `"in 5s"` (clock skew), `"-"` for None, `"?"` for NaN or
    infinity (a damaged record)."""
    if epoch_s is None:
        return "-"
    if not math.isfinite(epoch_s):
        return "?"
    delta = now_s - epoch_s
    for span in _SPANS:
        if abs(delta) >= span.seconds or span.unit == "s":
            amount = int(abs(delta) // span.seconds)
            return f"{amount}{span.unit} ago" if delta >= 0 else f"in {amount}{span.unit}"
    raise AssertionError("unreachable")  # pragma: no cover
