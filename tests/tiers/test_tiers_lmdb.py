from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

import lmdb
import msgspec
import pytest
from tiers_testlib import (
    CAPACITY_BYTES,
    flip_lmdb_value,
    put_loop_in_child,
    reader_after_growth_in_child,
    reader_in_child,
    writer_in_child,
)

from tiers.errors import CorruptionError, NamespaceError, TierConfigError
from tiers.lmdb import LMDBOptions, LMDBStore

OpenStore = Callable[..., LMDBStore]


def test_persists_across_close_and_reopen(tmp_path: Path, open_store: OpenStore) -> None:
    store = open_store()
    store.register_namespace("ns", {"v": 1})
    store.put_many("ns", [(b"k1", b"one"), (b"k2", b"two" * 100)], now_s=7.0)
    store.touch_many("ns", [b"k1"], now_s=9.0)
    store.close()
    store.close()  # idempotent
    with LMDBStore.open(tmp_path / "store", capacity_bytes=CAPACITY_BYTES, create=False) as again:
        assert again.namespaces() == {"ns": {"v": 1}}
        out = bytearray(300)
        assert again.get_into("ns", b"k2", out) == 300 and bytes(out) == b"two" * 100
        entry = again.meta("ns", b"k1")
        assert entry is not None and (entry.last_access_s, entry.num_hits) == (9.0, 1)
        stats = again.stats()
        assert (stats.num_entries, stats.used_bytes) == (2, 303)
        assert stats.file_bytes > 0 and stats.map_size_bytes >= 2 * CAPACITY_BYTES


def test_file_and_directory_modes(tmp_path: Path, open_store: OpenStore) -> None:
    open_store()
    path = tmp_path / "store"
    assert path.stat().st_mode & 0o777 == 0o700
    for name in ("data.mdb", "lock.mdb"):
        assert (path / name).stat().st_mode & 0o777 == 0o600


def test_flipped_byte_via_raw_transaction_is_detected(
    tmp_path: Path, open_store: OpenStore
) -> None:
    store = open_store()
    store.register_namespace("ns", {})
    store.put_many("ns", [(b"key", os.urandom(10_000))])
    store.close()
    flip_lmdb_value(tmp_path / "store", offset=5000)
    with (
        LMDBStore.open(tmp_path / "store", capacity_bytes=CAPACITY_BYTES) as again,
        pytest.raises(CorruptionError, match="checksum"),
    ):
        again.get_into("ns", b"key", bytearray(10_000))


def test_flipped_byte_in_the_file_is_detected(tmp_path: Path, open_store: OpenStore) -> None:
    store = open_store()
    store.register_namespace("ns", {})
    value = os.urandom(64 << 10)
    store.put_many("ns", [(b"key", value)])
    store.close()
    data_file = tmp_path / "store" / "data.mdb"
    raw = bytearray(data_file.read_bytes())
    position = raw.find(value[1000:1064])
    assert position >= 0
    raw[position] ^= 0x40
    data_file.write_bytes(bytes(raw))
    with (
        LMDBStore.open(tmp_path / "store", capacity_bytes=CAPACITY_BYTES) as again,
        pytest.raises(CorruptionError),
    ):
        again.get_into("ns", b"key", bytearray(64 << 10))


def test_sigkilled_writer_leaves_a_readable_consistent_store(tmp_path: Path) -> None:
    path, ready = tmp_path / "store", tmp_path / "ready"
    child = multiprocessing.get_context("spawn").Process(
        target=put_loop_in_child, args=(str(path), str(ready))
    )
    child.start()
    deadline = time.monotonic() + 60
    while not ready.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)  # let it get well into the loop
    assert child.pid is not None
    os.kill(child.pid, signal.SIGKILL)
    child.join(timeout=30)
    assert child.exitcode == -signal.SIGKILL
    with LMDBStore.open(path, capacity_bytes=1 << 40) as store:
        out = bytearray(64 << 10)
        metas = list(store.iter_meta("ns"))
        assert len(metas) >= 8
        for entry in metas:
            assert store.get_into("ns", entry.key, out) == entry.size_bytes
        stats = store.stats()
        assert stats.num_entries == len(metas)
        assert stats.used_bytes == sum(m.size_bytes for m in metas)
        store.put_many("ns", [(b"after", b"still writable")])


def test_reader_process_scans_while_a_writer_process_writes(tmp_path: Path) -> None:
    path, result = tmp_path / "store", tmp_path / "result"
    with LMDBStore.open(path, capacity_bytes=64 << 20) as store:
        store.register_namespace("ns", {"v": 1})
        store.put_many("ns", [(b"seed", b"s" * 1000)])
    context = multiprocessing.get_context("spawn")
    writer = context.Process(target=writer_in_child, args=(str(path), 3.0))
    reader = context.Process(target=reader_in_child, args=(str(path), 3.0, str(result)))
    writer.start()
    reader.start()
    writer.join(timeout=120)
    reader.join(timeout=120)
    assert (writer.exitcode, reader.exitcode) == (0, 0)
    num_scans, num_verified = map(int, result.read_text().split())
    assert num_scans > 1 and num_verified > num_scans


def test_map_full_grows_the_map(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with LMDBStore.open(
        tmp_path / "store", capacity_bytes=32 << 20, map_size_bytes=1 << 20
    ) as store:
        store.register_namespace("ns", {})
        with caplog.at_level(logging.WARNING, logger="tiers"):
            for batch in range(8):
                store.put_many(
                    "ns", [(f"{batch}-{i}".encode(), os.urandom(256 << 10)) for i in range(4)]
                )
        assert "grew LMDB map" in caplog.text
        assert store.stats().num_entries == 32
        assert store.stats().map_size_bytes > 1 << 20


def test_reader_process_adopts_a_map_grown_by_the_writer(tmp_path: Path) -> None:
    path = tmp_path / "store"
    ready, go, result = (str(tmp_path / name) for name in ("ready", "go", "result"))
    writer = LMDBStore.open(path, capacity_bytes=64 << 20, map_size_bytes=1 << 20)
    try:
        writer.register_namespace("ns", {})
        writer.put_many("ns", [(b"first", b"x" * 1000)])
        reader = multiprocessing.get_context("spawn").Process(
            target=reader_after_growth_in_child, args=(str(path), ready, go, result)
        )
        reader.start()
        deadline = time.monotonic() + 60
        while not Path(ready).exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        for batch in range(12):  # 12 MiB through a 1 MiB map: it grows several times
            writer.put_many(
                "ns", [(f"{batch}-{i}".encode(), os.urandom(1 << 20 >> 2)) for i in range(4)]
            )
        Path(go).touch()
        reader.join(timeout=120)
        assert reader.exitcode == 0
        map_before, map_after, num_read = map(int, Path(result).read_text().split())
        assert map_after > map_before
        assert num_read == 49
    finally:
        writer.close()


def test_readonly_open_shares_the_environment_and_refuses_writes(open_store: OpenStore) -> None:
    writer = open_store()
    writer.register_namespace("ns", {})
    writer.put_many("ns", [(b"k", b"v")])
    reader = open_store(readonly=True, capacity_bytes=None)
    assert reader.capacity_bytes == CAPACITY_BYTES  # recorded by the writer
    assert reader.contains("ns", b"k")
    with pytest.raises(TierConfigError, match="read-only"):
        reader.put_many("ns", [(b"k2", b"v")])
    reader.close()
    assert writer.contains("ns", b"k")  # the writer's environment is still open
    with pytest.raises(TierConfigError, match="already open"):
        open_store(options=LMDBOptions(sync=False))


def test_bad_paths_give_clear_errors(tmp_path: Path) -> None:
    def open_at(path: Path, **kwargs: object) -> LMDBStore:
        return LMDBStore.open(path, capacity_bytes=CAPACITY_BYTES, **kwargs)  # type: ignore[arg-type]

    with pytest.raises(TierConfigError, match=r"parent .* does not exist"):
        open_at(tmp_path / "missing" / "store")
    (tmp_path / "file").write_text("x")
    with pytest.raises(TierConfigError, match="is a file"):
        open_at(tmp_path / "file")
    (tmp_path / "empty").mkdir()
    with pytest.raises(TierConfigError, match="not a kvstore store"):
        open_at(tmp_path / "empty", create=False)
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "notes.txt").write_text("x")
    with pytest.raises(TierConfigError, match="non-empty directory"):
        open_at(tmp_path / "busy")
    with pytest.raises(TierConfigError, match="does not exist"):
        LMDBStore.open(tmp_path / "nothing", readonly=True)
    with pytest.raises(TierConfigError, match="capacity_bytes"):
        LMDBStore.open(tmp_path / "store")
    foreign = lmdb.open(str(tmp_path / "foreign"), max_dbs=2)
    foreign.open_db(b"theirs")
    foreign.close()
    with pytest.raises(TierConfigError, match="not a kvstore store"):
        open_at(tmp_path / "foreign")


def test_no_permission_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "locked"
    target.mkdir()
    LMDBStore.open(target / "existing", capacity_bytes=CAPACITY_BYTES).close()
    if os.geteuid() == 0:
        # root passes every permission check (and this venv's interpreter lives under /root,
        # so an unprivileged child cannot run it): simulate the kernel's answer instead.
        monkeypatch.setattr(os, "access", lambda path, mode: False)
    else:
        (target / "existing").chmod(0o500)
        target.chmod(0o500)
    try:
        with pytest.raises(TierConfigError, match=r"no write permission on .*locked"):
            LMDBStore.open(target / "store", capacity_bytes=CAPACITY_BYTES)
        with pytest.raises(TierConfigError, match=r"no permission to read and write .*existing"):
            LMDBStore.open(target / "existing", capacity_bytes=CAPACITY_BYTES)
    finally:
        target.chmod(0o700)
        (target / "existing").chmod(0o700)


def test_unknown_format_version_is_refused(tmp_path: Path, open_store: OpenStore) -> None:
    open_store().close()
    env = lmdb.open(str(tmp_path / "store"), max_dbs=8)
    with env.begin(write=True) as txn:
        store_db = env.open_db(b"store", txn=txn)
        txn.put(b"format", msgspec.msgpack.encode({"format_version": 99}), db=store_db)
    env.close()
    with pytest.raises(NamespaceError, match="format version 99"):
        LMDBStore.open(tmp_path / "store", capacity_bytes=CAPACITY_BYTES)
    with pytest.raises(NamespaceError, match="format version 99"):
        LMDBStore.open(tmp_path / "store", readonly=True)


def test_namespace_deleted_elsewhere_is_not_confused_with_a_new_one(open_store: OpenStore) -> None:
    first = open_store()
    second = open_store()  # e.g. the CLI in the same process
    first.register_namespace("ns", {"v": 1})
    first.put_many("ns", [(b"k", b"old")])
    second.delete_namespace("ns")
    second.register_namespace("ns", {"v": 2})
    assert not first.contains("ns", b"k")
    first.put_many("ns", [(b"k", b"new")])
    out = bytearray(3)
    assert second.get_into("ns", b"k", out) == 3 and bytes(out) == b"new"
    assert second.stats().namespaces["ns"].num_entries == 1
