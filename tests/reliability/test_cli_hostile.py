"""The store commands on hostile (but decodable) records: a per-key meta with times no clock can
show or a size no buffer can hold, a descriptor holding values JSON cannot: no crash, valid JSON.
"""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path

import pytest

from kvstore.cli._common import iso_time, relative_time
from reliability.checks import check_cli, run_cli
from tiers.lmdb import LMDBStore

NS = "c3c3c3c3"
KEY = b"\x44" * 16


@pytest.fixture
def store(tmp_path: Path) -> Path:
    path = tmp_path / "store"
    with LMDBStore.open(path, capacity_bytes=1 << 20, map_size_bytes=8 << 20) as opened:
        opened.register_namespace(NS, {"model": "m"})
        opened.put_many(NS, [(KEY, b"v" * 300), (b"\x45" * 16, b"w" * 300)])
    return path


def set_meta(path: Path, size: int, created_s: float, access_s: float) -> None:
    import lmdb

    env = lmdb.open(str(path), max_dbs=8, subdir=True, map_size=8 << 20)
    with env.begin(write=True) as txn:
        meta = env.open_db(b"meta", txn=txn)
        txn.put(struct.pack(">I", 1) + KEY, struct.pack("<QQddI", size, 0, created_s, access_s, 3),
                db=meta)  # fmt: skip
    env.close()


@pytest.mark.parametrize(
    "times",
    [(float("nan"), float("inf")), (1e300, -1e300), (-(2.0**62), 2.0**62)],
    ids=["nan-inf", "huge", "years-out-of-range"],
)
def test_times_no_clock_can_show_never_crash_a_command(
    store: Path, times: tuple[float, float]
) -> None:
    set_meta(store, 300, *times)
    for command in (["ls"], ["ls", "--json"], ["stat"], ["stat", "--json"], ["show", "44"],
                    ["show", "44", "--json"]):  # fmt: skip
        result = run_cli(command[0], store, *command[1:])
        check_cli(result, " ".join(command))
        if "--json" in command:
            json.loads(result.stdout)  # strict JSON: no NaN


def test_a_meta_record_claiming_a_huge_size_is_reported_corrupt(store: Path) -> None:
    set_meta(store, 1 << 63, 1.0, 1.0)
    result = run_cli("verify", store, "--json")
    check_cli(result, "verify")
    assert result.exit_code == 1
    document = json.loads(result.stdout)
    assert document["num_corrupt"] == 1
    assert "more than the whole store file" in document["corrupt"][0]["error"]
    assert run_cli("verify", store, "--repair").exit_code == 0


def test_a_descriptor_with_values_json_cannot_hold_prints_valid_json(tmp_path: Path) -> None:
    path = tmp_path / "store"
    with LMDBStore.open(path, capacity_bytes=1 << 20, map_size_bytes=8 << 20) as opened:
        opened.register_namespace(NS, {"model": b"\xff\x00", "odd": {1: b"x", 2.5: [b"y"]}})
        opened.put_many(NS, [(KEY, b"v" * 30)])
    for command in (["show", "44", "--json"], ["stat", "--json"]):
        result = run_cli(command[0], path, *command[1:])
        check_cli(result, command[0])
        assert result.exit_code == 0
        json.loads(result.stdout)


@pytest.mark.parametrize("value", [float("nan"), float("inf"), 1e300, -1e300])
def test_time_helpers_answer_for_any_float(value: float) -> None:
    assert iso_time(value) is None
    shown = relative_time(value, 1_700_000_000.0)
    if math.isfinite(value):
        assert shown.endswith(" ago") or shown.startswith("in ")
    else:
        assert shown == "?"
