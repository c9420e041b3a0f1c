from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest
import torch
from tiers_testlib import touch_rows_in_child

from tiers.cpu import DEFAULT_REGION_DIRECTORY, CPURegion, RegionHeader, reclaim_stale_regions
from tiers.errors import RegionError, TierConfigError

ROW_BYTES = 10_000  # not a multiple of 4096 on purpose


def test_create_attach_close_unlink(tmp_path: Path) -> None:
    with CPURegion.create("r1", 4, ROW_BYTES, directory=tmp_path) as owner:
        path = tmp_path / "r1"
        assert path.is_file()
        assert oct(path.stat().st_mode & 0o777) == "0o600"
        assert not list(tmp_path.glob(".*.tmp"))
        assert owner.is_owner and owner.num_rows == 4 and owner.row_bytes == ROW_BYTES
        owner.row_tensor(2).fill_(7)
        with CPURegion.attach("r1", directory=tmp_path, num_rows=4, row_bytes=ROW_BYTES) as worker:
            assert not worker.is_owner
            assert torch.all(worker.row_tensor(2) == 7)
            worker.row(1)[:3] = b"abc"
        assert path.is_file()  # a worker's close does not unlink
        assert bytes(owner.row(1)[:3]) == b"abc"
    assert not path.exists()
    owner.close()  # idempotent
    with pytest.raises(RegionError, match="closed"):
        owner.row_tensor(0)


def test_rows_are_aligned_bounded_and_views_share_memory(tmp_path: Path) -> None:
    with CPURegion.create("r2", 3, ROW_BYTES, directory=tmp_path) as region:
        for index in range(3):
            assert region.row_tensor(index).data_ptr() % 4096 == 0
            assert region.row_tensor(index).numel() == ROW_BYTES
            assert len(region.row(index)) == ROW_BYTES
        rows = region.rows_tensor()
        assert rows.shape == (3, ROW_BYTES)
        rows[1, -1] = 99
        assert region.row_tensor(1)[-1] == 99
        assert region.row(1)[-1] == 99
        for bad in (-1, 3):
            with pytest.raises(RegionError, match="out of range"):
                region.row(bad)


def test_attach_with_mismatching_size_names_both(tmp_path: Path) -> None:
    with CPURegion.create("r3", 2, ROW_BYTES, directory=tmp_path):
        with pytest.raises(RegionError, match=f"row_bytes={ROW_BYTES}.*row_bytes=4096"):
            CPURegion.attach("r3", directory=tmp_path, row_bytes=4096)
        with pytest.raises(RegionError, match=r"num_rows=2.*num_rows=5"):
            CPURegion.attach("r3", directory=tmp_path, num_rows=5)


def test_attach_missing_or_garbage_region(tmp_path: Path) -> None:
    with pytest.raises(RegionError, match="no CPU region"):
        CPURegion.attach("absent", directory=tmp_path)
    (tmp_path / "garbage").write_bytes(b"x" * 8192)
    with pytest.raises(RegionError, match="no valid header"):
        CPURegion.attach("garbage", directory=tmp_path)


def test_bad_arguments(tmp_path: Path) -> None:
    with pytest.raises(TierConfigError, match="file name"):
        CPURegion.create("a/b", 1, 1, directory=tmp_path)
    with pytest.raises(TierConfigError, match="positive"):
        CPURegion.create("r", 0, 1, directory=tmp_path)
    with pytest.raises(TierConfigError, match="does not exist"):
        CPURegion.create("r", 1, 1, directory=tmp_path / "missing")
    if not torch.cuda.is_available():
        with pytest.raises(TierConfigError, match="pin=True"):
            CPURegion.create("r", 1, 1, directory=tmp_path, pin=True)
        assert not (tmp_path / "r").exists()


def test_region_larger_than_the_free_space_fails_cleanly(tmp_path: Path) -> None:
    with pytest.raises(RegionError, match="cannot"):
        CPURegion.create("huge", 1 << 20, 1 << 30, directory=tmp_path)  # 1 PiB
    assert list(tmp_path.iterdir()) == []


def test_live_owner_is_refused(tmp_path: Path) -> None:
    with (
        CPURegion.create("live", 1, ROW_BYTES, directory=tmp_path),
        pytest.raises(RegionError, match=f"live process {os.getpid()}"),
    ):
        CPURegion.create("live", 1, ROW_BYTES, directory=tmp_path)


def _create_and_get_killed(directory: Path, name: str) -> int:
    code = textwrap.dedent(
        f"""
        import sys, time
        from tiers.cpu import CPURegion
        region = CPURegion.create({name!r}, 2, 4096, directory={str(directory)!r})
        print("ready", flush=True)
        time.sleep(60)
        """
    )
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None
    assert child.stdout.readline().strip() == "ready"
    child.send_signal(signal.SIGKILL)
    child.wait(timeout=30)
    return child.pid


def test_stale_region_of_a_killed_owner_is_reclaimed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    dead_pid = _create_and_get_killed(tmp_path, "stale")
    assert (tmp_path / "stale").exists()
    with (
        caplog.at_level(logging.WARNING, logger="tiers"),
        CPURegion.create("stale", 3, ROW_BYTES, directory=tmp_path) as region,
    ):
        assert region.num_rows == 3
        assert region.header.owner_pid == os.getpid()
    assert f"dead process {dead_pid}" in caplog.text


def test_unreadable_region_file_is_reclaimed_on_create(tmp_path: Path) -> None:
    (tmp_path / "junk").write_bytes(b"\0" * 100)
    with CPURegion.create("junk", 1, ROW_BYTES, directory=tmp_path) as region:
        assert region.row_bytes == ROW_BYTES


def test_reclaim_stale_regions_keeps_live_and_foreign_files(tmp_path: Path) -> None:
    _create_and_get_killed(tmp_path, "kvstore-dead")
    (tmp_path / "kvstore-foreign").write_bytes(b"not a region")
    (tmp_path / "other-file").write_bytes(b"x")
    with CPURegion.create("kvstore-live", 1, 4096, directory=tmp_path):
        removed = reclaim_stale_regions(tmp_path, prefix="kvstore-")
        assert removed == [tmp_path / "kvstore-dead"]
        assert (tmp_path / "kvstore-live").exists()
        assert (tmp_path / "kvstore-foreign").exists()
        assert (tmp_path / "other-file").exists()


def test_rows_are_shared_across_processes(tmp_path: Path) -> None:
    with CPURegion.create("shared", 6, ROW_BYTES, directory=tmp_path) as region:
        region.row_tensor(3).fill_(0xAB)
        child = multiprocessing.get_context("spawn").Process(
            target=touch_rows_in_child, args=(str(tmp_path), "shared")
        )
        child.start()
        child.join(timeout=120)
        assert child.exitcode == 0
        assert bytes(region.row(4)) == b"\xcd" * ROW_BYTES


def test_close_with_live_views_keeps_them_valid(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    region = CPURegion.create("views", 2, ROW_BYTES, directory=tmp_path)
    row = region.row_tensor(1)
    with caplog.at_level(logging.WARNING, logger="tiers"):
        region.close()
    assert "views are alive" in caplog.text
    row.fill_(5)  # still mapped: no crash
    assert int(row.sum()) == 5 * ROW_BYTES
    assert not (tmp_path / "views").exists()


def test_header_round_trip_and_default_directory(tmp_path: Path) -> None:
    header = RegionHeader(1, 123, 4, 100, 4096, 1.5)
    data = b"KVSTREG\0" + header.pack()[8:]
    assert RegionHeader.unpack(data, tmp_path) == header
    assert Path("/dev/shm") == DEFAULT_REGION_DIRECTORY
    if DEFAULT_REGION_DIRECTORY.is_dir():
        name = f"kvstore-test-{uuid.uuid4().hex[:8]}"
        with CPURegion.create(name, 1, 4096) as region:
            assert region.path == DEFAULT_REGION_DIRECTORY / name
        assert not region.path.exists()


def test_a_host_that_refuses_to_pin_gets_an_unpinned_region_and_a_warning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Seen on an H200 in a sandbox: cudaHostRegister refused the shared mapping (error 1). With
    `pin=None` the region still opens, unpinned, and says so; `pin=True` still fails."""
    from tiers import _cuda

    def refuse(address: int, size_bytes: int) -> None:
        raise RegionError(f"cudaHostRegister of {size_bytes} bytes failed with error 1")

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(_cuda, "host_register", refuse)
    with caplog.at_level(logging.WARNING, logger="tiers.cpu"):
        region = CPURegion.create("refused", 2, 4096, directory=tmp_path)
    with region:
        assert not region.is_pinned
        region.row(1)[:3] = b"abc"
        assert bytes(region.row(1)[:3]) == b"abc"
    assert "is not pinned" in caplog.text and "error 1" in caplog.text
    with pytest.raises(RegionError, match="error 1"):
        CPURegion.create("refused-required", 2, 4096, directory=tmp_path, pin=True)
    assert not (tmp_path / "refused-required").exists()
