"""The disk-writer process: LMDB writes of CPU rows from a child at low priority.

Real LMDB, a real region file and a real child process: what the child commits is what the
engine's store reads back, byte for byte; failures come back as the store's errors; a child that
dies is replaced (a bounded number of times) and never takes an acknowledgement with it; the
child ends with its engine, however the engine ends.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from kvstore.diskwriter.client import DiskWriterProcess
from kvstore.diskwriter.priority import IOPRIO_CLASS_BE, read_ioprio
from kvstore.keys import BlockKey
from kvstore.service.disk_io import DiskIO
from reliability.fs import MountUnavailable, small_filesystem
from tiers.cpu import CPURegion
from tiers.errors import StoreFullError, StoreIOError
from tiers.lmdb import LMDBStore

NS = "ns"
ROW_BYTES = 16384
NUM_ROWS = 8


def key(i: int) -> BlockKey:
    return BlockKey(i.to_bytes(16, "big"))


@pytest.fixture
def region(tmp_path: Path) -> Iterator[CPURegion]:
    name = f"kvstore-test-dw-{os.getpid()}-{tmp_path.name}"
    with CPURegion.create(name, NUM_ROWS, ROW_BYTES, directory="/dev/shm", pin=False) as made:
        for row in range(NUM_ROWS):
            made.row(row)[:] = bytes([row + 1]) * ROW_BYTES
        yield made


@pytest.fixture
def store(tmp_path: Path) -> Iterator[LMDBStore]:
    with LMDBStore.open(tmp_path / "db", capacity_bytes=4 * ROW_BYTES) as opened:
        opened.register_namespace(NS, {"row_bytes": ROW_BYTES})
        yield opened


@pytest.fixture
def writer(store: LMDBStore, region: CPURegion) -> Iterator[DiskWriterProcess]:
    started = DiskWriterProcess.start(
        store_path=store.path, capacity_bytes=store.capacity_bytes, region_path=region.path
    )
    yield started
    started.close()


def read(store: LMDBStore, i: int) -> bytes | None:
    out = bytearray(ROW_BYTES)
    return bytes(out) if store.get_into(NS, key(i), out) == ROW_BYTES else None


def test_what_the_child_commits_the_engine_reads_back(
    writer: DiskWriterProcess, store: LMDBStore
) -> None:
    assert writer.put_rows(NS, [(key(1), 0), (key(2), 3)], now_s=100.0) == 2 * ROW_BYTES
    assert read(store, 1) == bytes([1]) * ROW_BYTES
    assert read(store, 2) == bytes([4]) * ROW_BYTES
    writer.touch_many(NS, [key(1)], now_s=200.0)
    meta = store.meta(NS, key(1))
    assert meta is not None and (meta.last_access_s, meta.num_hits) == (200.0, 1)
    assert writer.delete_many(NS, [key(2), key(9)]) == 1
    assert read(store, 2) is None
    writer.sync()


def test_the_child_runs_at_low_cpu_and_io_priority(writer: DiskWriterProcess) -> None:
    pid = writer.pid
    assert pid is not None and pid != os.getpid()
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    nice, policy = int(fields[16]), int(fields[38])  # stat fields 19 and 41
    assert "nice10" in writer.applied_priority and nice == 10
    assert policy == os.SCHED_OTHER  # never SCHED_IDLE: it starved behind vLLM's OpenMP team
    if read_ioprio(pid) is not None:
        assert read_ioprio(pid) == (IOPRIO_CLASS_BE, 7)
    assert os.getpriority(os.PRIO_PROCESS, 0) != 10  # the engine's own priority is untouched


def test_a_full_store_and_a_bad_namespace_come_back_as_the_stores_errors(
    writer: DiskWriterProcess, store: LMDBStore
) -> None:
    with pytest.raises(StoreFullError) as full:
        writer.put_rows(NS, [(key(i), i) for i in range(5)], now_s=1.0)
    assert full.value.requested_bytes == 5 * ROW_BYTES and full.value.free_bytes == 4 * ROW_BYTES
    with pytest.raises(StoreIOError, match="not registered"):
        writer.put_rows("other", [(key(1), 0)], now_s=1.0)
    assert store.stats().num_entries == 0  # nothing of either was written
    assert writer.put_rows(NS, [(key(1), 0)], now_s=1.0) == ROW_BYTES  # the child lives on


def test_a_killed_child_fails_its_request_and_is_replaced_a_bounded_number_of_times(
    store: LMDBStore, region: CPURegion
) -> None:
    writer = DiskWriterProcess.start(
        store_path=store.path,
        capacity_bytes=store.capacity_bytes,
        region_path=region.path,
        max_restarts=1,
    )
    try:
        writer.put_rows(NS, [(key(1), 0)], now_s=1.0)
        first = writer.pid
        assert first is not None
        os.kill(first, signal.SIGKILL)
        with pytest.raises(StoreIOError, match=r"ended .*exit code -9"):
            writer.put_rows(NS, [(key(2), 1)], now_s=1.0)
        assert read(store, 2) is None  # not acknowledged, not written
        writer.put_rows(NS, [(key(3), 2)], now_s=1.0)  # a new child
        assert writer.pid not in (None, first)
        assert read(store, 1) == bytes([1]) * ROW_BYTES and read(store, 3) == bytes([3]) * ROW_BYTES
        os.kill(writer.pid or 0, signal.SIGKILL)
        with pytest.raises(StoreIOError):
            writer.put_rows(NS, [(key(4), 3)], now_s=1.0)
        with pytest.raises(StoreIOError, match="restarted 1 times"):
            writer.put_rows(NS, [(key(4), 3)], now_s=1.0)
    finally:
        writer.close()


def test_a_child_that_cannot_open_its_region_says_why(store: LMDBStore, tmp_path: Path) -> None:
    with pytest.raises(StoreIOError, match=r"did not start: .*region"):
        DiskWriterProcess.start(
            store_path=store.path,
            capacity_bytes=store.capacity_bytes,
            region_path=tmp_path / "no-such-region",
        )


def test_close_ends_the_child_after_it_synced(store: LMDBStore, region: CPURegion) -> None:
    writer = DiskWriterProcess.start(
        store_path=store.path, capacity_bytes=store.capacity_bytes, region_path=region.path
    )
    pid = writer.pid
    writer.put_rows(NS, [(key(1), 0)], now_s=1.0)
    writer.close()
    assert writer.pid is None and not Path(f"/proc/{pid}").exists()
    with pytest.raises(StoreIOError):  # no restart after close
        writer.put_rows(NS, [(key(2), 0)], now_s=1.0)


def test_the_child_ends_when_its_engine_is_killed(
    store: LMDBStore, region: CPURegion, tmp_path: Path
) -> None:
    engine = textwrap.dedent(
        f"""
        import os, signal, sys
        from kvstore.diskwriter.client import DiskWriterProcess
        writer = DiskWriterProcess.start(
            store_path={str(store.path)!r}, capacity_bytes={store.capacity_bytes},
            region_path={str(region.path)!r},
        )
        worker = os.fork()
        if worker == 0:  # like a forked vLLM worker, it keeps the engine's end of the socket open
            signal.pause()
        print(writer.pid, worker, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
        """
    )
    out, err = tmp_path / "out", tmp_path / "err"  # files: the worker would hold a pipe open
    with out.open("w") as stdout, err.open("w") as stderr:
        done = subprocess.run(
            [sys.executable, "-c", engine], stdout=stdout, stderr=stderr, timeout=60, check=False
        )
    assert done.returncode == -signal.SIGKILL, err.read_text()
    child, worker = (int(pid) for pid in out.read_text().split())
    try:
        deadline = time.monotonic() + 10
        while _is_running(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _is_running(child)
    finally:
        os.kill(worker, signal.SIGKILL)


def _is_running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def test_disk_io_writes_through_the_child(
    writer: DiskWriterProcess, store: LMDBStore, region: CPURegion
) -> None:
    disk = DiskIO(store, NS, region, writer=writer)
    done, report = disk.write([(key(1), 5), (key(2), 6)], victims=[])
    assert done.ok == (key(1), key(2)) and report.num_bytes == 2 * ROW_BYTES
    disk.write([(key(3), 7)], victims=[key(1)])
    assert read(store, 1) is None and read(store, 3) == bytes([8]) * ROW_BYTES
    full, _ = disk.write([(key(i), 0) for i in range(10, 14)], victims=[])
    assert full.failed and not full.ok  # refused by the store, counted by the caller
    region.row(0)[:] = b"\0" * ROW_BYTES
    promoted, _ = disk.read([(key(3), 0)])
    assert promoted.ok == (key(3),) and bytes(region.row(0)) == bytes([8]) * ROW_BYTES


# -- writemap and a full filesystem ----------------------------------------------------------------

FILL_ROW_BYTES = 256 << 10
FILL_ROWS = 4


def test_the_child_writes_through_the_map_with_its_blocks_allocated_first(
    writer: DiskWriterProcess, store: LMDBStore
) -> None:
    writer.put_rows(NS, [(key(1), 0)], now_s=1.0)
    data = os.stat(store.path / "data.mdb")
    assert data.st_size == store.stats().map_size_bytes  # writemap: LMDB sized the file to its map
    assert data.st_blocks * 512 >= (64 << 20)  # allocated ahead: a step of 64 MiB
    assert read(store, 1) == bytes([1]) * ROW_BYTES


def test_a_full_filesystem_fails_writes_without_killing_the_writemap_child(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """With writemap, a store into a page no disk block backs is SIGBUS. The child allocates
    the blocks first; when the filesystem has no room it goes on without writemap, where LMDB
    can reuse the free pages inside the file: after freeing half the store a write succeeds,
    and every acknowledged row reads back."""
    try:
        with small_filesystem(40 << 20) as directory:
            _fill_a_small_filesystem(directory, tmp_path, capfd)
    except MountUnavailable as exc:
        pytest.skip(f"cannot mount a small filesystem here: {exc}")


def _fill_a_small_filesystem(
    directory: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    name = f"kvstore-test-dwfull-{os.getpid()}-{tmp_path.name}"
    with (
        CPURegion.create(name, FILL_ROWS, FILL_ROW_BYTES, directory="/dev/shm", pin=False) as rows,
        LMDBStore.open(directory / "db", capacity_bytes=1 << 30) as store,
    ):
        store.register_namespace(NS, {"row_bytes": FILL_ROW_BYTES})
        for row in range(FILL_ROWS):
            rows.row(row)[:] = bytes([row + 7]) * FILL_ROW_BYTES
        writer = DiskWriterProcess.start(
            store_path=store.path, capacity_bytes=store.capacity_bytes, region_path=rows.path
        )
        try:
            pid = writer.pid
            acked: dict[int, int] = {}
            num_refused, next_key = 0, 0
            while num_refused < 3:
                batch = {next_key + i: i % FILL_ROWS for i in range(3)}
                next_key += 3
                try:
                    writer.put_rows(NS, [(key(k), row) for k, row in batch.items()], now_s=1.0)
                except StoreIOError:
                    num_refused += 1
                    continue
                acked.update(batch)
            assert len(acked) * FILL_ROW_BYTES > (20 << 20)  # the filesystem, not less, was full
            freed = list(acked)[: len(acked) // 2]
            # two transactions: LMDB reuses a page only once the transaction after the one
            # that freed it has committed (its previous snapshot must stay intact)
            for part in (freed[::2], freed[1::2]):
                assert writer.delete_many(NS, [key(k) for k in part]) == len(part)
            for k in freed:
                del acked[k]
            writer.put_rows(NS, [(key(next_key), 1)], now_s=1.0)
            acked[next_key] = 1
            assert writer.pid == pid  # never killed (SIGBUS) nor replaced
        finally:
            writer.close()
        out = bytearray(FILL_ROW_BYTES)
        for k, row in acked.items():
            assert store.get_into(NS, key(k), out) == FILL_ROW_BYTES
            assert out == bytes([row + 7]) * FILL_ROW_BYTES
    assert "writing without writemap from now on" in capfd.readouterr().err
