"""`kvstore stat`, `ls` and `show` on a real LMDB store, human and JSON."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from kvstore.cli._common import format_bytes, relative_time
from kvstore.cli.show import decode_chunk, short_layer_names
from tiers.lmdb import LMDBStore

from .helpers import (
    BARE,
    BARE_VALUE_BYTES,
    BASE_S,
    BLOCKS_PER_CHUNK,
    CAPACITY_BYTES,
    LAYER_NAMES,
    NAMESPACES,
    TP1,
    TP2,
    BuiltStore,
    run,
    run_json,
)

# -- stat -------------------------------------------------------------------------------------


def test_stat_json_reports_occupancy_namespaces_and_access_times(built: BuiltStore) -> None:
    doc = run_json("stat", built.path)
    assert doc["num_entries"] == len(built.values) == 10
    assert doc["used_bytes"] == built.used_bytes()
    assert doc["capacity_bytes"] == CAPACITY_BYTES
    assert doc["fill_ratio"] == pytest.approx(built.used_bytes() / CAPACITY_BYTES, abs=1e-6)
    assert doc["file_bytes"] > 0
    assert doc["oldest_access_s"] == BASE_S
    assert doc["newest_access_s"] == BASE_S + 21
    assert doc["newest_access_iso"].startswith("2023-11-14T22:13")
    by_id = {ns["namespace_id"]: ns for ns in doc["namespaces"]}
    assert list(by_id) == sorted(NAMESPACES)
    tp1 = by_id[TP1]
    assert tp1["model"] == "tiny-llama"
    assert tp1["kv_dtype"] == "bfloat16"
    assert tp1["layout_summary"] == "2 layers x [2, 32, 64] bfloat16"
    assert (tp1["engine_block_size"], tp1["num_tokens_per_chunk"], tp1["tp_size"]) == (16, 32, 1)
    assert tp1["created_by"] == "tests"
    assert tp1["num_entries"] == 4
    assert by_id[TP2]["tp_size"] == 2
    assert by_id[BARE]["has_chunk_layout"] is False
    assert by_id[BARE]["used_bytes"] == 2 * BARE_VALUE_BYTES


def test_stat_human_prints_the_store_and_each_namespace(built: BuiltStore) -> None:
    result = run("stat", built.path)
    assert result.exit_code == 0, result.stderr
    for text in ("entries", "10", "8.0 MiB", *NAMESPACES, "tiny-llama", "2 layers x"):
        assert text in result.stdout
    assert result.stderr == ""


def test_stat_of_an_empty_store(tmp_path: Path) -> None:
    LMDBStore.open(tmp_path / "empty", capacity_bytes=1 << 20).close()
    doc = run_json("stat", tmp_path / "empty")
    assert (doc["num_entries"], doc["oldest_access_s"], doc["namespaces"]) == (0, None, [])
    assert run("stat", tmp_path / "empty").exit_code == 0


# -- ls ---------------------------------------------------------------------------------------


def test_ls_json_lists_every_chunk_most_recent_first(built: BuiltStore) -> None:
    doc = run_json("ls", built.path)
    chunks = doc["chunks"]
    assert doc["num_chunks"] == len(chunks) == 10
    accesses = [chunk["last_access_s"] for chunk in chunks]
    assert accesses == sorted(accesses, reverse=True)
    first = chunks[0]
    assert first["namespace"] == BARE
    assert first["key"] == built.keys[BARE][1].hex()
    assert first["size_bytes"] == BARE_VALUE_BYTES
    assert first["num_hits"] == 0
    assert first["created_s"] == BASE_S + 21
    assert first["last_access_iso"].endswith("+00:00")
    assert first["checksum_state"] == "unverified"


@pytest.mark.parametrize(
    ("sort", "field", "descending"),
    [("age", "last_access_s", True), ("size", "size_bytes", True), ("key", "key", False)],
)
def test_ls_sorts(built: BuiltStore, sort: str, field: str, descending: bool) -> None:
    values = [chunk[field] for chunk in run_json("ls", built.path, "--sort", sort)["chunks"]]
    assert values == sorted(values, reverse=descending)
    reversed_values = [
        chunk[field] for chunk in run_json("ls", built.path, "--sort", sort, "--reverse")["chunks"]
    ]
    assert reversed_values == sorted(values, reverse=not descending)


def test_ls_namespace_limit_and_verify(built: BuiltStore) -> None:
    doc = run_json("ls", built.path, "--namespace", "a1b2c3d4e5f60002", "--limit", "2", "--verify")
    assert doc["num_chunks"] == 4
    assert [c["key"] for c in doc["chunks"]] == [k.hex() for k in built.keys[TP2][::-1][:2]]
    assert {c["checksum_state"] for c in doc["chunks"]} == {"ok"}


def test_ls_takes_a_unique_namespace_prefix(built: BuiltStore) -> None:
    doc = run_json("ls", built.path, "--namespace", "b0b0")
    assert {c["namespace"] for c in doc["chunks"]} == {BARE}


def test_ls_hits_order_follows_touches(built: BuiltStore) -> None:
    with LMDBStore.open(built.path, capacity_bytes=CAPACITY_BYTES) as store:
        store.touch_many(TP1, [built.keys[TP1][2]], now_s=BASE_S + 100)
        store.touch_many(TP1, [built.keys[TP1][2]], now_s=BASE_S + 101)
    chunks = run_json("ls", built.path, "--sort", "hits", "--limit", "1")["chunks"]
    assert (chunks[0]["key"], chunks[0]["num_hits"]) == (built.keys[TP1][2].hex(), 2)
    assert chunks[0]["last_access_s"] == BASE_S + 101


def test_ls_human_has_short_keys_and_a_count(built: BuiltStore) -> None:
    result = run("ls", built.path, "--limit", "3")
    assert result.exit_code == 0, result.stderr
    assert built.keys[BARE][1].hex()[:16] in result.stdout  # the 16-hex short key (issue 14)
    assert built.keys[BARE][1].hex()[:17] not in result.stdout
    assert "3 of 10 chunks" in result.stdout
    assert "unverified" in result.stdout


# -- show -------------------------------------------------------------------------------------


def _expected_layer(tensor: torch.Tensor) -> dict[str, float | int]:
    values = tensor.to(torch.float64).reshape(-1)
    finite = values[~torch.isnan(values)]
    return {
        "min": float(finite.min()),
        "max": float(finite.max()),
        "mean": float(finite.mean()),
        "num_nan": int(torch.isnan(values).sum()),
    }


def test_show_decodes_every_layer_with_the_registered_layout(built: BuiltStore) -> None:
    key = built.keys[TP1][0]
    doc = run_json("show", built.path, key.hex()[:6])
    assert doc["chunk"]["key"] == key.hex()
    assert doc["chunk"]["checksum_state"] == "ok"
    assert doc["descriptor"]["model"] == "tiny-llama"
    assert doc["tp_size"] == 1
    assert doc["decode_skipped_reason"] is None
    assert [layer["name"] for layer in doc["layers"]] == list(LAYER_NAMES)
    for layer, name in zip(doc["layers"], LAYER_NAMES, strict=True):
        blocks = built.tp1_caches[name][:BLOCKS_PER_CHUNK]
        assert layer["dtype"] == "bfloat16"
        assert layer["shape"] == [BLOCKS_PER_CHUNK, 2, 32, 64]
        expected = _expected_layer(blocks)
        for field in ("min", "max", "mean"):
            assert math.isclose(layer[field], expected[field], rel_tol=1e-9), field
        assert layer["num_nan"] == expected["num_nan"]
    assert doc["layers"][1]["num_nan"] == 1  # the NaN planted in layer 1, block 0


def test_show_decodes_each_tensor_parallel_rank(built: BuiltStore) -> None:
    key = built.keys[TP2][3]
    doc = run_json("show", built.path, key.hex()[:8], "--namespace", TP2)
    assert doc["tp_size"] == 2
    assert [(layer["rank"], layer["name"]) for layer in doc["layers"]] == [
        (rank, name) for rank in range(2) for name in LAYER_NAMES
    ]
    for layer in doc["layers"]:
        blocks = built.ranks[layer["rank"]][layer["name"]][3 * BLOCKS_PER_CHUNK :]
        assert math.isclose(layer["mean"], _expected_layer(blocks)["mean"], rel_tol=1e-9)


def test_show_human_has_metadata_and_a_layer_table(built: BuiltStore) -> None:
    result = run("show", built.path, built.keys[TP2][0].hex()[:6])
    assert result.exit_code == 0, result.stderr
    for text in (built.keys[TP2][0].hex(), "ok", "layers (model.layers.*.self_attn.attn)"):
        assert text in result.stdout
    assert "rank" in result.stdout
    assert "2x2x32x64" in result.stdout


def test_show_without_a_chunk_layout_prints_metadata_and_why(built: BuiltStore) -> None:
    doc = run_json("show", built.path, built.keys[BARE][0].hex()[:4])
    assert doc["chunk"]["checksum_state"] == "ok"
    assert doc["layers"] == []
    assert "no chunk_layout" in doc["decode_skipped_reason"]
    result = run("show", built.path, built.keys[BARE][0].hex()[:4])
    assert result.exit_code == 0
    assert "no decode" in result.stdout


# -- helpers ----------------------------------------------------------------------------------


def test_decode_explains_a_value_that_does_not_fit_the_descriptor(built: BuiltStore) -> None:
    descriptor = run_json("show", built.path, built.keys[TP1][0].hex()[:6])["descriptor"]
    value = memoryview(bytearray(built.values[(TP1, built.keys[TP1][0])]))
    assert len(decode_chunk(value, descriptor).layers) == 2
    short = decode_chunk(value[:-2], descriptor)
    assert "row_bytes" in short.skipped_reason
    assert short.layers == []
    bad_tp = decode_chunk(value, {**descriptor, "tp_size": 0})
    assert "tp_size" in bad_tp.skipped_reason
    broken = decode_chunk(value, {**descriptor, "chunk_layout": {"version": 9}})
    assert "cannot be read" in broken.skipped_reason


def test_short_layer_names() -> None:
    assert short_layer_names(["m.layers.0.attn", "m.layers.1.attn", "m.layers.10.attn"]) == (
        ["0", "1", "10"],
        "m.layers.*.attn",
    )
    assert short_layer_names(["k", "v"]) == (["k", "v"], "")
    assert short_layer_names(["only"]) == (["only"], "")
    assert short_layer_names(["a.x", "a.x.y"]) == (["a.x", "a.x.y"], "")


@pytest.mark.parametrize(
    ("delta_s", "text"),
    [(0, "0s ago"), (59, "59s ago"), (61, "1m ago"), (7200, "2h ago"), (3 * 86400, "3d ago"),
     (800 * 86400, "2y ago"), (-5, "in 5s")],
)  # fmt: skip
def test_relative_time(delta_s: float, text: str) -> None:
    assert relative_time(BASE_S - delta_s, BASE_S) == text


def test_format_bytes() -> None:
    assert [format_bytes(n) for n in (0, 1023, 1536, 8 << 20, 3 << 40)] == [
        "0 B", "1023 B", "1.5 KiB", "8.0 MiB", "3.0 TiB",
    ]  # fmt: skip
