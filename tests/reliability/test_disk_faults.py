"""Scenario 3 at the store level: full, read-only, truncated and replaced store files.

Every trial runs the store in a forked child (`reliability.isolation.in_child`): before the
fixes these trials died by SIGBUS, which would have killed pytest itself.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from reliability.damage import DAMAGES, Damage, check_damage, small_store, used_bytes
from reliability.disk_faults import SWAPS, fill_until_full, read_only_mid_run, swap_under_open_store
from reliability.fs import MountUnavailable, small_filesystem
from reliability.isolation import in_child
from tiers import LMDBOptions
from tiers.lmdb import LMDBStore

# tiers/' LMDB store on a failing disk: nothing of vLLM
pytestmark = pytest.mark.vllm_free


def _open_readonly_error(path: Path) -> str:
    try:
        LMDBStore.open(path, readonly=True, create=False).close()
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return "opened"


@pytest.mark.parametrize("size", [8192, 12288, "half", "one page short"])
def test_a_truncated_data_file_is_refused_before_it_is_mapped(size: int | str) -> None:
    with small_store() as path:
        data = path / "data.mdb"
        full = used_bytes(data)
        cut = {"half": full // 2, "one page short": full - 4096}.get(str(size), size)
        with data.open("r+b") as file:
            file.truncate(int(cut))
        result = in_child(lambda: _open_readonly_error(path), timeout_s=60)
    assert result.how == "returned", result.describe()  # not killed by SIGBUS
    assert result.value.startswith("StoreDamagedError"), result.value
    assert "truncated" in result.value


@pytest.mark.parametrize("damage", DAMAGES, ids=lambda d: d.name)
def test_read_commands_on_a_damaged_store_fail_with_one_line(damage: Damage) -> None:
    codes = check_damage(damage)  # raises Crash on a traceback, a signal or a hang
    assert set(codes) <= set(damage.exit_codes)


@pytest.mark.parametrize("how", SWAPS)
def test_a_data_file_swapped_under_an_open_store_is_refused(tmp_path: Path, how: str) -> None:
    result = swap_under_open_store(tmp_path, how, seed=3)
    assert result.how == "returned", result.how
    assert result.num_bad == 0
    assert result.num_detected == result.num_acked  # every read after the swap refused
    assert result.num_refused == 1  # and the write after it
    assert result.errors == ["StoreIOError"]


def test_a_read_only_directory_fails_reopening_cleanly_and_loses_nothing() -> None:
    result = read_only_mid_run(seed=5)
    assert result.how == "returned"
    assert result.num_refused == 2, result.notes  # reopening for writing, and for reading
    assert result.errors == ["TierConfigError"]
    assert (result.num_lost, result.num_bad, result.is_verify_ok) == (0, 0, True)


# -- a full filesystem ---------------------------------------------------------------------------


def test_writemap_is_off_by_default() -> None:
    """With writemap LMDB writes values through the map: on a full filesystem the write into a
    page no disk block backs kills the process with SIGBUS instead of failing the commit."""
    assert LMDBOptions().writemap is False


@pytest.mark.parametrize("seed", [1, 2])
def test_a_full_filesystem_fails_writes_cleanly_and_loses_nothing(seed: int) -> None:
    try:
        with small_filesystem(8 << 20) as directory:
            result, acked = fill_until_full(directory, seed)
    except MountUnavailable as exc:
        pytest.skip(f"cannot mount a small filesystem here: {exc}")
    assert result.how == "returned", result.how  # before the fix: "signal: SIGBUS"
    assert result.num_refused == 5
    assert set(result.errors) <= {"StoreIOError", "StoreFullError"}
    assert acked and result.num_acked == len(acked)
    assert (result.num_lost, result.num_bad) == (0, 0)
    assert result.is_verify_ok, result.notes
    assert not result.notes  # the write after freeing half the store succeeded


def test_a_writemap_store_refuses_writes_on_a_full_filesystem_instead_of_dying() -> None:
    """With writemap (the disk-writer process's setting) disk blocks are allocated before LMDB
    stores into its map; a filesystem without room raises StoreNoSpaceError, never SIGBUS, and
    the store keeps every acknowledged write. (Writing into the freed pages afterwards is the
    disk writer's fallback to plain writes: tests/service/test_disk_writer.py.)"""
    try:
        with small_filesystem(8 << 20) as directory:
            result, acked = fill_until_full(directory, 3, LMDBOptions(writemap=True))
    except MountUnavailable as exc:
        pytest.skip(f"cannot mount a small filesystem here: {exc}")
    assert result.how == "returned", result.how  # without the allocation: "signal: SIGBUS"
    assert result.num_refused == 5 and "StoreNoSpaceError" in result.errors
    assert acked and result.num_acked == len(acked)
    assert (result.num_lost, result.num_bad) == (0, 0)
    assert result.is_verify_ok, result.notes
