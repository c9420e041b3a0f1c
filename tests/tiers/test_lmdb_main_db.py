"""The main-database walk before a store opens (`tiers._lmdb_main_db`): it refuses a store whose
main database would send LMDB past the file's end (a SIGBUS, found by the damage fuzz in
`tests/reliability/test_hostile_inputs.py`), and never refuses a healthy one, also while
another process commits to it.

Damage is judged by an oracle that does not use the check: a forked child opens the damaged
copy with raw py-lmdb and reads every database (`test_lmdb_filecheck._read_every_page`).
"""

from __future__ import annotations

import multiprocessing
import os
import random
import shutil
import time
from pathlib import Path

from reliability.isolation import in_child
from tests.tiers.test_lmdb_filecheck import NAMESPACE, _read_every_page, _store
from tiers._lmdb_filecheck import problem_before_open
from tiers._lmdb_main_db import main_db_problem
from tiers._lmdb_pages import newest_meta
from tiers.lmdb import LMDBStore


def _check(path: Path) -> str:
    fd = os.open(path / "data.mdb", os.O_RDONLY)
    try:
        return problem_before_open(fd)
    finally:
        os.close(fd)


def _main_root(path: Path) -> tuple[int, int]:
    """(the main database's root page, the page size) of the newest snapshot."""
    fd = os.open(path / "data.mdb", os.O_RDONLY)
    try:
        meta = newest_meta(fd)
        assert meta is not None
        assert main_db_problem(fd, meta, os.fstat(fd).st_size) == ""
        return meta.main_root, meta.page_bytes
    finally:
        os.close(fd)


def test_damage_to_the_main_database_is_refused_wherever_a_reader_would_die(
    tmp_path: Path,
) -> None:
    healthy = tmp_path / "healthy"
    rng = random.Random(5)
    with _store(healthy) as store:
        store.put_many(NAMESPACE, [(rng.randbytes(16), rng.randbytes(3000)) for _ in range(40)])
    root, page_bytes = _main_root(healthy)
    assert _check(healthy) == ""
    num_deaths = 0
    for seed in range(24):
        copy = tmp_path / f"damaged-{seed}"
        shutil.copytree(healthy, copy)
        damage = random.Random(seed)
        offset = root * page_bytes + damage.randrange(16, page_bytes - 64)  # past the header
        with (copy / "data.mdb").open("r+b") as file:
            file.seek(offset)
            file.write(damage.randbytes(damage.randrange(8, page_bytes)))
        problem = _check(copy)
        reader = in_child(lambda copy=copy: _read_every_page(str(copy)), timeout_s=60)
        if reader.how == "signal":
            num_deaths += 1
            assert "main database" in problem, (seed, reader.describe())
        if problem:  # refused: the store's own open says so, it never reaches LMDB's reads
            opened = in_child(lambda copy=copy: _open_readonly(copy), timeout_s=60)
            assert opened.how == "raised" and "cannot be opened" in opened.describe()
    assert num_deaths > 0  # the damage reached the case this guards against


def _open_readonly(path: Path) -> int:
    with LMDBStore.open(path, readonly=True) as store:
        return store.stats().num_entries


def _commit_forever(path: str, stop_at: float) -> None:
    rng = random.Random(9)
    with LMDBStore.open(Path(path), capacity_bytes=1 << 28) as store:
        keys: list[bytes] = []
        while time.monotonic() < stop_at:
            new = [rng.randbytes(16) for _ in range(rng.randrange(1, 6))]
            store.put_many(NAMESPACE, [(k, rng.randbytes(rng.choice((200, 5000)))) for k in new])
            keys += new
            if len(keys) > 40:
                doomed, keys = keys[:20], keys[20:]
                store.delete_many(NAMESPACE, doomed)


def test_a_store_another_process_commits_to_is_never_refused(tmp_path: Path) -> None:
    path = tmp_path / "live"
    with _store(path):
        pass
    stop_at = time.monotonic() + 4.0
    writer = multiprocessing.get_context("spawn").Process(
        target=_commit_forever, args=(str(path), stop_at)
    )
    writer.start()
    try:
        checks = 0
        fd = os.open(path / "data.mdb", os.O_RDONLY)
        try:
            while time.monotonic() < stop_at - 0.2:
                assert problem_before_open(fd) == ""
                checks += 1
        finally:
            os.close(fd)
    finally:
        writer.join(timeout=30)
    assert writer.exitcode == 0
    fd = os.open(path / "data.mdb", os.O_RDONLY)
    try:
        meta = newest_meta(fd)
        assert meta is not None and meta.txn_id > 50  # the writer really was committing
    finally:
        os.close(fd)
    assert checks > 100
