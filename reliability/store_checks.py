"""What the engine scenarios check in a store between (and during) engine runs.

`acknowledged_keys` replays a trial's events log (`events_log`): a chunk is acknowledged on
disk from its disk `stored` event (emitted once the write committed; an engine also reports
every chunk it found on disk at start) until a disk `removed` event (emitted before the delete
runs), so "acknowledged and not found afterwards" is a chunk lost, and the race with a delete
in flight can only undercount. A torn last line (the writer was killed mid-line) is skipped.
`verify_store` runs `kvstore verify --json` (in this process), `store_keys` lists what a
store holds, `flip_values` is bit rot: a second process rewriting random values through LMDB.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lmdb

from reliability.checks import run_cli
from tiers.lmdb import LMDBStore

__all__ = [
    "Flip",
    "VerifyResult",
    "acknowledged_keys",
    "ancestors",
    "flip_values",
    "region_files",
    "removed_keys",
    "store_keys",
    "verify_store",
]


def _events(log_path: Path, tier: str | None = "disk") -> Iterator[dict[str, Any]]:
    """The events of `tier` (all when None) in `log_path` and its rotated files, oldest first."""
    paths = [log_path.with_name(f"{log_path.name}.{n}") for n in range(9, 0, -1)] + [log_path]
    for path in paths:
        if not path.is_file():
            continue
        for line in path.read_text(errors="replace").splitlines():
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if isinstance(event, dict) and (tier is None or event.get("tier") == tier):
                yield event


def ancestors(log_path: Path) -> dict[str, str]:
    """Each chunk's parent (the chunk before it in its prompt), from the lineage of stored
    events: an event's keys are consecutive and `parent` precedes its first key."""
    parents: dict[str, str] = {}
    for event in _events(log_path, tier=None):
        if event.get("type") != "stored":
            continue
        parent = event.get("parent")
        for key in event.get("keys", ()):
            if parent is not None:
                parents.setdefault(key, parent)
            parent = key
    return parents


def acknowledged_keys(log_path: Path) -> set[str]:
    """Hex keys the log says are on disk at its end (module docstring)."""
    keys: set[str] = set()
    for event in _events(log_path):
        if event.get("type") == "stored":
            keys.update(event.get("keys", ()))
        elif event.get("type") == "removed":
            keys.difference_update(event.get("keys", ()))
    return keys


def removed_keys(log_path: Path, reason: str) -> set[str]:
    """Hex keys the log says were removed from disk for `reason` ("corrupt", "missing", ...)."""
    keys: set[str] = set()
    for event in _events(log_path):
        if event.get("type") == "removed" and event.get("reason") == reason:
            keys.update(event.get("keys", ()))
    return keys


def store_keys(store: Path) -> set[str]:
    """Hex keys of every chunk in `store`, all namespaces (empty when there is no store yet)."""
    if not (store / "data.mdb").is_file():
        return set()
    with LMDBStore.open(store, readonly=True, create=False) as opened:
        return {key.hex() for ns in opened.namespaces() for key in opened.iter_keys(ns)}


@dataclass(frozen=True, slots=True)
class VerifyResult:
    exit_code: int
    num_checked: int = 0
    num_corrupt: int = 0
    num_repaired: int = 0
    corrupt_keys: tuple[str, ...] = ()
    error: str = ""

    @property
    def is_ok(self) -> bool:
        return self.exit_code == 0


def verify_store(store: Path, *, repair: bool = False) -> VerifyResult:
    """`kvstore verify STORE --json [--repair]`."""
    result = run_cli("verify", store, "--json", *(["--repair"] if repair else []))
    try:
        report: dict[str, Any] = json.loads(result.stdout)
    except ValueError:
        return VerifyResult(result.exit_code, error=(result.stderr or result.stdout)[-300:])
    return VerifyResult(
        exit_code=result.exit_code,
        num_checked=int(report.get("num_checked", 0)),
        num_corrupt=int(report.get("num_corrupt", 0)),
        num_repaired=int(report.get("num_repaired", 0)),
        corrupt_keys=tuple(bad["key"] for bad in report.get("corrupt", ())),
        error=result.stderr.strip()[-300:],
    )


def region_files(region_dir: Path) -> dict[str, int]:
    """kvstore's CPU region files in `region_dir`: name -> inode."""
    if not region_dir.is_dir():
        return {}
    return {p.name: p.stat().st_ino for p in region_dir.glob("kvstore-*") if p.is_file()}


@dataclass(frozen=True, slots=True)
class Flip:
    """One value damaged: its LMDB key (namespace ordinal + chunk key), the chunk key's hex."""

    db_key: bytes
    chunk_hex: str
    offset: int


def flip_values(
    store: Path, num_values: int, rng: random.Random, *, only: frozenset[str] | None = None
) -> list[Flip]:
    """Flip one random bit in each of `num_values` random values of `store` (distinct; among
    the chunk keys `only` when given), in one LMDB write transaction, as a process other than
    the engine would; the per-key metadata (and its checksum) is left as it was."""
    env = lmdb.open(str(store), max_dbs=8, subdir=True, create=False)
    try:
        data = env.open_db(b"data", create=False)
        with env.begin(write=True, db=data) as txn:
            keys = [bytes(k) for k in txn.cursor().iternext(keys=True, values=False)]
            candidates = [k for k in keys if only is None or k[4:].hex() in only]
            flips = []
            for key in rng.sample(candidates, min(num_values, len(candidates))):
                value = bytearray(txn.get(key) or b"")
                if not value:
                    continue
                offset = rng.randrange(len(value))
                value[offset] ^= 1 << rng.randrange(8)
                txn.put(key, bytes(value))
                flips.append(Flip(key, key[4:].hex(), offset))
            return flips
    finally:
        env.close()
