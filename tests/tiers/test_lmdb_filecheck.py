"""The data-file length check: never a finding on a healthy store, always one before a read of a
page past the end could kill the process.

Healthy stores come from random workloads that include LMDB's *loose* pages (allocated and
freed in one transaction, never written: the file then ends before `mm_last_pg`), checked after
every commit, with concurrent readers, and with the writer in another process. Damage comes
from real truncation at random page boundaries, judged by an oracle that does not use the
check: a forked child opens a copy with raw py-lmdb and reads every page a reader or writer
would (every entry and value of every database, then a write commit that reads the free list).
The check must flag a cut exactly when that child dies.
"""

from __future__ import annotations

import os
import random
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import lmdb
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reliability.isolation import in_child
from reliability.lmdb_churn import churn
from tiers import LMDBOptions, StoreDamagedError
from tiers._lmdb_env import SharedEnv
from tiers._lmdb_filecheck import DataFileCheck, problem_before_open
from tiers._lmdb_pages import first_page_in_use_past_end, newest_meta
from tiers.lmdb import LMDBStore

NAMESPACE = "c0ffee00"


def _shared(store: LMDBStore) -> SharedEnv:
    return store._env()


def _burst(store: LMDBStore, rng: random.Random, num_keys: int) -> None:
    """Put `num_keys` small keys and delete them in ONE transaction: the leaf pages it splits
    off and merges back are LMDB's loose pages."""
    shared = _shared(store)
    with shared.write_txn() as txn:
        keys = [rng.randbytes(20) for _ in range(num_keys)]
        for key in keys:
            txn.put(key, rng.randbytes(150), db=shared.dbs[b"meta"])
        for key in keys:
            txn.delete(key, db=shared.dbs[b"meta"])


def _is_short(path: Path) -> bool:
    fd = os.open(path / "data.mdb", os.O_RDONLY)
    try:
        meta = newest_meta(fd)
        assert meta is not None
        return os.fstat(fd).st_size < meta.needed_bytes
    finally:
        os.close(fd)


def _problems(path: Path, store: LMDBStore) -> tuple[str, str]:
    """(the check before open, the check under the open store) on the file as it is now."""
    fd = os.open(path / "data.mdb", os.O_RDONLY)
    try:
        before = problem_before_open(fd)
    finally:
        os.close(fd)
    shared = _shared(store)
    return before, DataFileCheck(shared.data_fd).problem(shared._pinned_txn_id)


@contextmanager
def _store(path: Path, writemap: bool = False) -> Iterator[LMDBStore]:
    options = LMDBOptions(writemap=writemap)
    with LMDBStore.open(path, capacity_bytes=1 << 28, options=options) as store:
        store.register_namespace(NAMESPACE, {"model": "filecheck"})
        yield store


def test_loose_pages_leave_a_healthy_file_short_and_it_passes(tmp_path: Path) -> None:
    rng = random.Random(1)
    with _store(tmp_path / "s") as store:
        store.put_many(NAMESPACE, [(rng.randbytes(16), rng.randbytes(3000)) for _ in range(30)])
        _burst(store, rng, 1000)
        assert _is_short(tmp_path / "s")  # the case the old check called truncated
        assert _problems(tmp_path / "s", store) == ("", "")
        assert store.stats().num_entries == 30  # and every transaction still works
    with LMDBStore.open(tmp_path / "s", readonly=True) as reopened:  # the check at open
        assert reopened.stats().num_entries == 30


_OPS = st.lists(
    st.tuples(
        st.sampled_from(["put", "overwrite", "delete", "touch", "burst"]), st.integers(1, 400)
    ),
    min_size=5,
    max_size=40,
)


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(ops=_OPS, seed=st.integers(0, 2**32), writemap=st.booleans())
def test_random_workloads_are_never_flagged_after_any_commit(
    tmp_path: Path, ops: list[tuple[str, int]], seed: int, writemap: bool
) -> None:
    path = tmp_path / f"s{seed}-{writemap}"
    rng = random.Random(seed)
    keys: list[bytes] = []
    try:
        with _store(path, writemap) as store:
            for op, n in ops:
                _apply(store, rng, keys, op, n)
                assert _problems(path, store) == ("", ""), (op, n)
            out = bytearray(20000)
            assert all(store.get_into(NAMESPACE, key, out) is not None for key in keys)
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _apply(store: LMDBStore, rng: random.Random, keys: list[bytes], op: str, n: int) -> None:
    if op == "put":
        new = [rng.randbytes(16) for _ in range(1 + n // 20)]
        store.put_many(NAMESPACE, [(k, rng.randbytes(rng.choice((100, 3000, 20000)))) for k in new])
        keys += new
    elif op == "overwrite" and keys:
        store.put_many(NAMESPACE, [(k, rng.randbytes(900)) for k in rng.sample(keys, 1)])
    elif op == "delete" and keys:
        doomed = rng.sample(keys, min(len(keys), n // 10 + 1))
        store.delete_many(NAMESPACE, doomed)
        keys[:] = [k for k in keys if k not in doomed]
    elif op == "touch" and keys:
        store.touch_many(NAMESPACE, rng.sample(keys, min(len(keys), 5)))
    elif op == "burst":
        _burst(store, rng, n)


@pytest.mark.parametrize("seed", [1, 2])
def test_churn_with_concurrent_readers_finds_nothing(tmp_path: Path, seed: int) -> None:
    result = churn(tmp_path / "store", seed, 600, num_readers=2)
    assert result.findings == []
    assert result.num_commits == 600 and result.num_reads > 0


@pytest.mark.parametrize("writemap", [False, True])
def test_churn_with_the_writer_in_another_process_finds_nothing(
    tmp_path: Path, writemap: bool
) -> None:
    """`writemap`: the writer writes through its map (and sizes the file to it), as kvstore's
    disk-writer process does, while the readers here read without it, as the engine does."""
    result = churn(
        tmp_path / "store", 3, 300, num_readers=2, writer_process=True, writemap=writemap
    )
    assert result.findings == []
    assert result.num_commits == 300 and result.num_reads > 0


# -- real truncation, judged by a child that reads every page without the check ---------------


def _read_every_page(path: str) -> int:
    """Raw py-lmdb, no kvstore check: read every entry and value of every database, then
    commit a write (which reads the free list). Dies by SIGBUS if a used page is gone."""
    env = lmdb.open(path, max_dbs=8, readonly=False, lock=True)
    num = 0
    with env.begin() as txn:
        names = [bytes(key) for key, _ in txn.cursor()]
        for name in names:
            for _, value in txn.cursor(db=env.open_db(name, txn=txn, create=False)):
                num += len(value)
    with env.begin(write=True) as txn:
        txn.put(b"oracle", b"x" * 5000, db=env.open_db(b"meta", txn=txn))
    env.close()
    return num


def _churned_store(path: Path, seed: int) -> None:
    """A store whose tail mixes used pages, free pages (values deleted later) and loose pages."""
    rng = random.Random(seed)
    keys: list[bytes] = []
    with _store(path) as store:
        for _ in range(6):
            new = [rng.randbytes(16) for _ in range(12)]
            store.put_many(NAMESPACE, [(k, rng.randbytes(rng.choice((300, 9000)))) for k in new])
            keys += new
            doomed = rng.sample(keys, 8)
            store.delete_many(NAMESPACE, doomed)
            keys = [k for k in keys if k not in doomed]
            _burst(store, rng, rng.choice((300, 1200)))


def _judge_cut(original: Path, copy: Path, cut_bytes: int) -> tuple[str, int | None, bool, str]:
    """(the check's finding, the first used page past the cut, whether the raw reader died)."""
    shutil.copytree(original, copy)
    os.truncate(copy / "data.mdb", cut_bytes)
    fd = os.open(copy / "data.mdb", os.O_RDONLY)
    try:
        problem = problem_before_open(fd)
        meta = newest_meta(fd)
        assert meta is not None
        past_end = first_page_in_use_past_end(fd, meta, cut_bytes)
    finally:
        os.close(fd)
    child = in_child(lambda: _read_every_page(str(copy)), timeout_s=60)
    return problem, past_end, not child.returned, child.describe()


def test_a_cut_is_flagged_exactly_when_a_reader_would_die(tmp_path: Path) -> None:
    outcomes = []
    for seed in range(3):
        original = tmp_path / f"original{seed}"
        _churned_store(original, seed)
        page_bytes = 4096
        num_pages = (original / "data.mdb").stat().st_size // page_bytes
        rng = random.Random(seed)
        cuts = {*range(max(2, num_pages - 25), num_pages), *rng.sample(range(2, num_pages), 6)}
        for cut in sorted(cuts):
            copy = tmp_path / f"cut{seed}-{cut}"
            problem, past_end, dies, how = _judge_cut(original, copy, cut * page_bytes)
            outcomes.append(dies)
            assert bool(problem) == dies, (seed, cut, problem, how)
            assert (past_end is not None) == dies
            if dies:
                assert "truncated" in problem and f"page {past_end} " in problem
            shutil.rmtree(copy)
    assert True in outcomes and False in outcomes, outcomes  # both kinds of cut were tried


def test_a_cut_inside_a_used_page_is_flagged(tmp_path: Path) -> None:
    with _store(tmp_path / "s") as store:
        store.put_many(NAMESPACE, [(bytes([i]) * 16, bytes([i]) * 9000) for i in range(20)])
    data = tmp_path / "s" / "data.mdb"
    os.truncate(data, data.stat().st_size - 100)
    with pytest.raises(Exception, match="truncated"):
        LMDBStore.open(tmp_path / "s", readonly=True)


def test_a_cut_under_the_open_store_is_refused_on_the_next_read(tmp_path: Path) -> None:
    def run() -> str:
        with _store(tmp_path / "s") as store:
            keys = [bytes([i]) * 16 for i in range(30)]
            store.put_many(NAMESPACE, [(k, k * 600) for k in keys])
            os.truncate(tmp_path / "s" / "data.mdb", 5 * 4096)
            try:
                store.get_into(NAMESPACE, keys[-1], bytearray(9600))
            except Exception as exc:
                return f"{type(exc).__name__}: {exc}"
            return "read"

    result = in_child(run, timeout_s=60)
    assert result.returned, result.describe()  # no SIGBUS
    assert result.value.startswith("StoreIOError") and "truncated" in result.value


@pytest.mark.parametrize("readonly", [True, False])
def test_an_empty_data_file_is_refused_for_reading_and_for_writing(
    tmp_path: Path, readonly: bool
) -> None:
    """The engine (a writer) and the CLI (a reader) give one answer: LMDB would silently make a
    new store over a zero-byte file for a writer, hiding that the old one is gone."""
    with _store(tmp_path / "s"):
        pass
    os.truncate(tmp_path / "s" / "data.mdb", 0)
    with pytest.raises(StoreDamagedError, match=r"empty \(0 bytes\)"):
        LMDBStore.open(tmp_path / "s", readonly=readonly, capacity_bytes=1 << 20)
    assert (tmp_path / "s" / "data.mdb").stat().st_size == 0  # left as it was found
