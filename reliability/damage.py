"""Damaged store files on disk, and what the CLI must do with them.

`DAMAGES` is a catalogue of ways a store directory gets broken outside kvstore (a disk that
lost the tail of a file, a copy that wrote random bytes, an emptied file, a stray lock file).
`check_damage` builds a small store, damages it, and runs `kvstore verify`, `stat` and `ls` on
it in a forked child each (a SIGBUS from mapping a truncated file must not take the caller
down): each must exit 1 (or 2 where the path is no longer a store at all) with exactly one
`error:` line, or exit 0 when the damage left the store intact, and never crash.
`damage_bytes` is the hypothesis form: overwrite or cut the data file at any offset.
"""

from __future__ import annotations

import os
import random
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from reliability.checks import Crash, check_cli, run_cli
from reliability.isolation import in_child
from tiers.lmdb import LMDBStore

__all__ = [
    "CLI_COMMANDS",
    "DAMAGES",
    "Damage",
    "check_damage",
    "damage_bytes",
    "small_store",
    "used_bytes",
]

CLI_COMMANDS = ("verify", "stat", "ls")
_CHILD_TIMEOUT_S = 60.0


@dataclass(frozen=True, slots=True)
class Damage:
    name: str
    apply: Callable[[Path], object]
    exit_codes: tuple[int, ...] = (1,)  # what the read commands may exit with


@contextmanager
def small_store(num_chunks: int = 40, chunk_bytes: int = 3000) -> Iterator[Path]:
    """A store of `num_chunks` random chunks in a temporary directory (removed afterwards)."""
    base = Path(tempfile.mkdtemp(prefix="kvstore-damage-"))
    path = base / "store"
    rng = random.Random(num_chunks * chunk_bytes)
    try:
        with LMDBStore.open(path, capacity_bytes=1 << 24, map_size_bytes=1 << 25) as store:
            store.register_namespace("d4d4d4d4", {"model": "damage"})
            chunks = [(i.to_bytes(8, "big"), rng.randbytes(chunk_bytes)) for i in range(num_chunks)]
            store.put_many("d4d4d4d4", chunks)
        yield path
    finally:
        shutil.rmtree(base, ignore_errors=True)


def used_bytes(data: Path) -> int:
    """The bytes of the file that hold data: its size, or less where it is sparse (with LMDB's
    writemap the file is as large as the map)."""
    stat = data.stat()
    return min(stat.st_size, stat.st_blocks * 512)


def _truncate_to(fraction: float) -> Callable[[Path], None]:
    def apply(path: Path) -> None:
        data = path / "data.mdb"
        os.truncate(data, int(used_bytes(data) * fraction))

    return apply


def _truncate_bytes(size: int) -> Callable[[Path], None]:
    return lambda path: os.truncate(path / "data.mdb", size)


def _random_from(offset: int) -> Callable[[Path], None]:
    def apply(path: Path) -> None:
        data = path / "data.mdb"
        size = data.stat().st_size
        with data.open("r+b") as file:
            file.seek(offset)
            file.write(random.Random(offset).randbytes(max(0, size - offset)))

    return apply


def _replace_with_directory(path: Path) -> None:
    (path / "data.mdb").unlink()
    (path / "data.mdb").mkdir()


DAMAGES: tuple[Damage, ...] = (
    Damage("zero-length data.mdb", _truncate_bytes(0)),
    Damage("data.mdb cut to 100 bytes", _truncate_bytes(100)),
    Damage("data.mdb cut to one page", _truncate_bytes(4096)),
    Damage("data.mdb cut to the two meta pages", _truncate_bytes(8192)),
    Damage("data.mdb cut in half", _truncate_to(0.5)),
    Damage(
        "data.mdb cut by one page",
        lambda p: _truncate_bytes(used_bytes(p / "data.mdb") - 4096)(p),
    ),
    Damage("data.mdb all random bytes", _random_from(0)),
    Damage("data.mdb random after the meta pages", _random_from(8192), (0, 1)),
    Damage("lock file only (data.mdb deleted)", lambda p: (p / "data.mdb").unlink()),
    Damage("random lock.mdb", lambda p: (p / "lock.mdb").write_bytes(os.urandom(8192)), (0, 1)),
    Damage("no lock.mdb", lambda p: (p / "lock.mdb").unlink(), (0, 1)),
    Damage("data.mdb is a directory", _replace_with_directory),
)


def _run_commands(path: Path, exit_codes: tuple[int, ...]) -> list[int]:
    codes = []
    for command in CLI_COMMANDS:
        result = run_cli(command, path)
        check_cli(result, command)
        if result.exit_code not in exit_codes:
            tail = (result.stderr or result.stdout).strip()[-200:]
            raise Crash(f"kvstore {command} exited {result.exit_code} (want {exit_codes}): {tail}")
        codes.append(result.exit_code)
    return codes


def check_damage(damage: Damage) -> list[int]:
    """Damage a fresh store; the exit codes of `verify`, `stat`, `ls` on it (Crash if any
    command broke the CLI's promise, died by a signal or hung)."""
    with small_store() as path:
        damage.apply(path)
        result = in_child(
            lambda: _run_commands(path, damage.exit_codes), timeout_s=_CHILD_TIMEOUT_S
        )
    if not result.returned:
        raise Crash(f"{damage.name}: the CLI {result.describe()}")
    return list(result.value)


def damage_bytes(offset_fraction: float, length: int, cut: bool, seed: int) -> list[int]:
    """Overwrite `length` random bytes at `offset_fraction` of the data file, or cut the file
    there (`cut`); run the read commands; their exit codes (Crash as in `check_damage`)."""

    def apply(path: Path) -> None:
        data = path / "data.mdb"
        offset = int(used_bytes(data) * offset_fraction)
        if cut:
            os.truncate(data, offset)
            return
        with data.open("r+b") as file:
            file.seek(offset)
            file.write(random.Random(seed).randbytes(length))

    return check_damage(
        Damage(f"bytes at {offset_fraction:.3f} ({length}, cut={cut})", apply, (0, 1))
    )
