"""The `kvstore` CLI reads, lists and verifies what LMDBTier wrote, also while it runs."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner, Result

from kvstore.cli import app

from .helpers import SLOT_BYTES, Harness, flip_stored_byte, key

runner = CliRunner()


def run(*args: str | Path) -> Result:
    return runner.invoke(app, [str(arg) for arg in args])


def test_ls_and_stat_show_the_tiers_chunks_while_it_runs(harness: Harness) -> None:
    tier = harness.open()
    values = harness.store(tier, 1, 0, 3)
    result = run("ls", harness.path, "--json", "--verify")
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["num_chunks"] == 3
    assert {row["key"] for row in doc["chunks"]} == {k.hex() for k in values}
    assert {row["namespace"] for row in doc["chunks"]} == {tier.namespace}
    assert {row["checksum_state"] for row in doc["chunks"]} == {"ok"}
    assert {row["size_bytes"] for row in doc["chunks"]} == {SLOT_BYTES}

    result = run("stat", harness.path, "--json")
    assert result.exit_code == 0, result.stderr
    (namespace,) = json.loads(result.stdout)["namespaces"]
    assert namespace["namespace_id"] == tier.namespace
    assert (namespace["model"], namespace["kv_dtype"]) == ("tiny-llama", "bfloat16")
    assert namespace["num_entries"] == 3
    assert namespace["layout_summary"].startswith("2 layers")


def test_verify_finds_the_value_the_tier_would_refuse(harness: Harness) -> None:
    tier = harness.open()
    harness.store(tier, 1, 0, 3)
    tier.shutdown()
    result = run("verify", harness.path)
    assert result.exit_code == 0, result.stderr
    assert "3 ok, 0 corrupt" in result.stdout

    flip_stored_byte(harness.path, key(2))
    result = run("verify", harness.path, "--json")
    assert result.exit_code == 1
    doc = json.loads(result.stdout)
    assert (doc["num_ok"], doc["num_corrupt"]) == (2, 1)
    assert doc["corrupt"][0]["key"] == key(2).hex()
