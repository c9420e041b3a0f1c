"""`kvstore verify` finds a flipped bit, and `--repair` deletes exactly the bad chunk."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import lmdb

from .helpers import BARE, TP1, TP2, BuiltStore, flip_byte, run, run_json, store_keys


def test_verify_a_clean_store(built: BuiltStore) -> None:
    doc = run_json("verify", built.path)
    assert (doc["num_checked"], doc["num_ok"], doc["num_corrupt"]) == (10, 10, 0)
    assert doc["corrupt"] == []
    result = run("verify", built.path)
    assert result.exit_code == 0
    assert "checked 10 chunks: 10 ok, 0 corrupt" in result.stdout


def test_verify_one_namespace(built: BuiltStore) -> None:
    assert run_json("verify", built.path, "--namespace", BARE)["num_checked"] == 2


def test_verify_finds_a_bit_flip_and_repair_removes_it(
    built: BuiltStore, raw_env: Callable[[Path], lmdb.Environment]
) -> None:
    bad_key = built.keys[TP2][1]
    env = raw_env(built.path)
    flip_byte(env, TP2, bad_key)
    env.close()

    doc = run_json("verify", built.path, exit_code=1)
    assert (doc["num_ok"], doc["num_corrupt"], doc["num_corrupt_remaining"]) == (9, 1, 1)
    assert doc["corrupt"][0]["key"] == bad_key.hex()
    assert doc["corrupt"][0]["namespace"] == TP2
    assert "checksum" in doc["corrupt"][0]["error"]
    human = run("verify", built.path)
    assert human.exit_code == 1
    assert bad_key.hex()[:16] in human.stdout
    assert "run with --repair" in human.stderr

    ls = run_json("ls", built.path, "--namespace", TP2, "--verify")
    states = {c["key"]: c["checksum_state"] for c in ls["chunks"]}
    assert states.pop(bad_key.hex()) == "corrupt"
    assert set(states.values()) == {"ok"}
    shown = run("show", built.path, bad_key.hex()[:8])
    assert shown.exit_code == 1
    assert "corrupt" in shown.stdout
    assert "fails its checksum" in shown.stderr

    repaired = run_json("verify", built.path, "--repair", exit_code=0)
    assert (repaired["num_corrupt"], repaired["num_repaired"]) == (1, 1)
    assert repaired["num_corrupt_remaining"] == 0
    keys = store_keys(built.path)
    assert keys[TP2] == set(built.keys[TP2]) - {bad_key}
    assert keys[TP1] == set(built.keys[TP1])
    assert run("verify", built.path).exit_code == 0


def test_repair_on_a_clean_store_changes_nothing(built: BuiltStore) -> None:
    doc = run_json("verify", built.path, "--repair")
    assert (doc["num_repaired"], doc["num_corrupt_remaining"]) == (0, 0)
    assert sum(len(keys) for keys in store_keys(built.path).values()) == 10
