"""Scenario 3's mechanics at the store level (no engine): a full disk, a store directory made
read-only mid-run, and a data file truncated or replaced under an open store.

Each trial runs the store in a forked child, so a SIGBUS (a write into a mapped page no disk
block backs, a read past the end of a truncated file) is reported instead of killing the
caller. Values are derived from seeds, so the parent can check every chunk the child was told
was written ("acknowledged") without passing the bytes back: a chunk acknowledged and then not
found is lost, a chunk read back with other bytes is bad data.
"""

from __future__ import annotations

import os
import random
import shutil
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from reliability.checks import run_cli
from reliability.damage import used_bytes
from reliability.isolation import in_child
from tiers.errors import CorruptionError, TierError
from tiers.lmdb import LMDBOptions, LMDBStore

__all__ = [
    "NAMESPACE",
    "TrialResult",
    "audit",
    "fill_until_full",
    "read_only_mid_run",
    "swap_under_open_store",
]

NAMESPACE = "f5f5f5f5"
_CHILD_TIMEOUT_S = 120.0
_NOBODY = 65534


@dataclass(slots=True)
class TrialResult:
    """What one trial saw. `how` is how the child ended ("returned", "signal: SIGBUS", ...)."""

    how: str = "returned"
    num_acked: int = 0
    num_refused: int = 0  # writes that failed with a TierError (the fault, handled)
    num_lost: int = 0
    num_bad: int = 0
    num_detected: int = 0  # reads after the fault that raised instead of returning bytes
    is_verify_ok: bool | None = None
    errors: list[str] = field(default_factory=list)  # distinct error types seen
    notes: list[str] = field(default_factory=list)

    @property
    def is_clean(self) -> bool:
        return self.how == "returned" and self.num_lost == 0 and self.num_bad == 0


def value_of(seed: int, size: int) -> bytes:
    return random.Random(seed).randbytes(size)


def key_of(seed: int) -> bytes:
    return seed.to_bytes(8, "big")


def audit(path: Path, acked: dict[int, int], result: TrialResult) -> None:
    """Count lost and bad chunks among `acked` (seed -> size) and run `kvstore verify`."""
    with LMDBStore.open(path, readonly=True, create=False) as store:
        for seed, size in acked.items():
            out = bytearray(size)
            try:
                got = store.get_into(NAMESPACE, key_of(seed), out)
            except CorruptionError:  # detected, not served: the chunk is lost
                got = None
            if got is None:
                result.num_lost += 1
            elif bytes(out[:got]) != value_of(seed, size):
                result.num_bad += 1
    verified = run_cli("verify", path, "--json")
    result.is_verify_ok = verified.exit_code == 0
    if not result.is_verify_ok:
        result.notes.append(f"verify exited {verified.exit_code}: {verified.stderr.strip()[:200]}")


def _child(fn: Any) -> TrialResult:
    outcome = in_child(fn, timeout_s=_CHILD_TIMEOUT_S)
    if not outcome.returned:
        return TrialResult(how=outcome.describe())
    return TrialResult(**outcome.value)


# -- a full filesystem ---------------------------------------------------------------------------


def fill_until_full(
    directory: Path, seed: int, options: LMDBOptions | None = None
) -> tuple[TrialResult, dict[int, int]]:
    """Write random-size chunks into a store in `directory` (on a small filesystem) until the
    filesystem refuses them, then a few more, then delete some and write again (`options`: the
    store's LMDB options).

    Returns the child's result and the acknowledged chunks (seed -> size) still expected."""
    path = directory / f"store-{seed}"

    def run() -> dict[str, Any]:
        result = TrialResult()
        acked: dict[int, int] = {}
        rng = random.Random(seed)
        with LMDBStore.open(
            path, capacity_bytes=1 << 30, map_size_bytes=1 << 30, options=options
        ) as store:
            store.register_namespace(NAMESPACE, {"model": "fill"})
            next_seed = seed * 1_000_000
            while result.num_refused < 5:
                batch = {next_seed + i: rng.randrange(16 << 10, 400 << 10) for i in range(3)}
                next_seed += 3
                items = [(key_of(s), value_of(s, size)) for s, size in batch.items()]
                try:
                    store.put_many(NAMESPACE, items)
                except TierError as exc:
                    result.num_refused += 1
                    if type(exc).__name__ not in result.errors:
                        result.errors.append(type(exc).__name__)
                    continue
                acked.update(batch)
            freed = dict(list(acked.items())[: len(acked) // 2])
            store.delete_many(NAMESPACE, [key_of(s) for s in freed])
            for s in freed:
                del acked[s]
            again = {next_seed: 32 << 10}
            try:
                store.put_many(NAMESPACE, [(key_of(next_seed), value_of(next_seed, 32 << 10))])
                acked.update(again)
            except TierError as exc:
                result.notes.append(f"a write after freeing half failed: {exc}")
        result.num_acked = len(acked)
        return {**asdict(result), "notes": [*result.notes, f"acked={acked}"]}

    result = _child(run)
    acked = _parse_acked(result)
    if result.how == "returned":
        audit(path, acked, result)
    return result, acked


def _parse_acked(result: TrialResult) -> dict[int, int]:
    for note in list(result.notes):
        if note.startswith("acked="):
            result.notes.remove(note)
            pairs = note.removeprefix("acked={").removesuffix("}")
            return {int(k): int(v) for k, v in (p.split(": ") for p in pairs.split(", ") if p)}
    return {}


# -- a file truncated or replaced under an open store --------------------------------------------

SWAPS = ("truncate-0", "truncate-half", "truncate-page", "replace", "overwrite")


def _swap(path: Path, how: str, seed: int) -> None:
    data = path / "data.mdb"
    size = used_bytes(data)
    if how.startswith("truncate"):
        target = {"truncate-0": 0, "truncate-half": size // 2, "truncate-page": size - 4096}[how]
        os.truncate(data, target)
    elif how == "replace":  # a new file renamed over the old one (a restore from a backup)
        fresh = path / "data.mdb.new"
        fresh.write_bytes(random.Random(seed).randbytes(size))
        fresh.replace(data)
    else:  # overwritten in place after the meta pages
        with data.open("r+b") as file:
            file.seek(8192)
            file.write(random.Random(seed).randbytes(size - 8192))


def swap_under_open_store(directory: Path, how: str, seed: int) -> TrialResult:
    """Write chunks, damage the data file (`how`, one of SWAPS) under the open store, then read
    every chunk and write once more: each must fail cleanly or return the exact bytes."""
    path = directory / f"store-{how}-{seed}"

    def run() -> dict[str, Any]:
        result = TrialResult()
        seeds = {seed * 1000 + i: 4096 + i * 977 for i in range(40)}
        with LMDBStore.open(path, capacity_bytes=1 << 26, map_size_bytes=1 << 27) as store:
            store.register_namespace(NAMESPACE, {"model": "swap"})
            store.put_many(NAMESPACE, [(key_of(s), value_of(s, n)) for s, n in seeds.items()])
            result.num_acked = len(seeds)
            _swap(path, how, seed)
            for s, size in seeds.items():
                out = bytearray(size)
                try:
                    got = store.get_into(NAMESPACE, key_of(s), out)
                except TierError as exc:
                    result.num_detected += 1
                    _note_error(result, exc)
                    continue
                if got is not None and bytes(out[:got]) != value_of(s, size):
                    result.num_bad += 1
            try:
                store.put_many(NAMESPACE, [(b"after", b"x" * 1000)])
                result.notes.append("a write after the damage succeeded")
            except TierError as exc:
                result.num_refused += 1
                _note_error(result, exc)
        return asdict(result)

    return _child(run)


def _note_error(result: TrialResult, exc: BaseException) -> None:
    if type(exc).__name__ not in result.errors:
        result.errors.append(type(exc).__name__)


# -- a directory made read-only mid-run -----------------------------------------------------------


def read_only_mid_run(seed: int) -> TrialResult:
    """As an unprivileged user (root drops to nobody in the child; root ignores permissions):
    write chunks, make the store directory 0500 and its files 0400, keep writing, close, and
    reopen for writing and for reading. Writes through the open store go on (permissions are
    checked when a file is opened); reopening must fail with a TierError, never crash. Then
    the permissions are restored and every acknowledged chunk must read back intact."""
    base = Path(tempfile.mkdtemp(prefix="kvstore-readonly-"))
    path = base / "store"
    if os.geteuid() == 0:
        os.chown(base, _NOBODY, _NOBODY)

    def run() -> dict[str, Any]:
        if os.geteuid() == 0:
            os.setgid(_NOBODY)
            os.setuid(_NOBODY)
        return _lock_while_writing(path, seed)

    try:
        result = _child(run)
        acked = _parse_acked(result)
        if result.how == "returned":
            audit(path, acked, result)
        return result
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _lock_while_writing(path: Path, seed: int) -> dict[str, Any]:
    """Write, make the store read-only, write again, then try to reopen it; restore modes."""
    result = TrialResult()
    seeds = {seed * 1000 + i: 2048 + i for i in range(20)}
    with LMDBStore.open(path, capacity_bytes=1 << 24, map_size_bytes=1 << 25) as store:
        store.register_namespace(NAMESPACE, {"model": "ro"})
        store.put_many(NAMESPACE, [(key_of(s), value_of(s, n)) for s, n in seeds.items()])
        _set_modes(path, dir_mode=0o500, file_mode=0o400)
        late = seed * 1000 + 999
        try:
            store.put_many(NAMESPACE, [(key_of(late), value_of(late, 512))])
            seeds[late] = 512
        except TierError as exc:
            result.num_refused += 1
            _note_error(result, exc)
    for readonly in (False, True):
        try:
            LMDBStore.open(path, capacity_bytes=1 << 24, readonly=readonly).close()
            result.notes.append(f"reopening read-only={readonly} worked")
        except TierError as exc:
            result.num_refused += 1
            _note_error(result, exc)
    _set_modes(path, dir_mode=0o700, file_mode=0o600)
    result.num_acked = len(seeds)
    return {**asdict(result), "notes": [*result.notes, f"acked={seeds}"]}


def _set_modes(path: Path, *, dir_mode: int, file_mode: int) -> None:
    for file in (path / "data.mdb", path / "lock.mdb"):
        file.chmod(file_mode)
    path.chmod(dir_mode)
