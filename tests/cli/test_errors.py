"""Bad input: one line on stderr, no traceback, exit 2 (usage) or 1 (operational)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import lmdb
import msgspec
import pytest
from typer.testing import Result

from .helpers import BARE, TP1, BuiltStore, run

# Every store command, given the store path `{store}`.
STORE_COMMANDS = [
    ["stat", "{store}"],
    ["ls", "{store}"],
    ["show", "{store}", "01"],
    ["verify", "{store}"],
    ["rm", "{store}", "--all", "--yes"],
    ["gc", "{store}", "--max-bytes", "1MiB", "--yes"],
]


def assert_one_line_error(result: Result, code: int, *fragments: str) -> None:
    assert result.exit_code == code, (result.stdout, result.stderr)
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ")
    assert "Traceback" not in result.stderr
    for fragment in fragments:
        assert fragment in lines[0]


def run_on(command: list[str], store: Path, *extra: str) -> Result:
    return run(*(part.format(store=store) for part in command), *extra)


@pytest.mark.parametrize("command", STORE_COMMANDS, ids=lambda c: c[0])
@pytest.mark.parametrize("as_json", [False, True], ids=["human", "json"])
def test_a_missing_path(tmp_path: Path, command: list[str], as_json: bool) -> None:
    extra = ("--json",) if as_json else ()
    result = run_on(command, tmp_path / "nope", *extra)
    assert_one_line_error(result, 2, "does not exist")


@pytest.mark.parametrize("command", STORE_COMMANDS, ids=lambda c: c[0])
def test_a_directory_that_is_not_a_store(tmp_path: Path, command: list[str]) -> None:
    (tmp_path / "notes.txt").write_text("hello")
    assert_one_line_error(run_on(command, tmp_path), 2, "not a kvstore store")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]  # nothing created


@pytest.mark.parametrize("command", STORE_COMMANDS, ids=lambda c: c[0])
def test_a_file_instead_of_a_directory(tmp_path: Path, command: list[str]) -> None:
    path = tmp_path / "file"
    path.write_text("x")
    assert_one_line_error(run_on(command, path), 2, "is a file")


def test_an_lmdb_environment_that_is_not_a_kvstore(tmp_path: Path) -> None:
    env = lmdb.open(str(tmp_path / "other"), max_dbs=2)
    env.open_db(b"something")
    env.close()
    assert_one_line_error(run("stat", tmp_path / "other"), 2, "not a kvstore store")


def test_a_store_of_an_incompatible_format_version(
    built: BuiltStore, raw_env: Callable[[Path], lmdb.Environment]
) -> None:
    env = raw_env(built.path)
    with env.begin(write=True) as txn:
        store_db = env.open_db(b"store", txn=txn)
        txn.put(b"format", msgspec.msgpack.encode({"format_version": 99}), db=store_db)
    env.close()
    for command in STORE_COMMANDS:
        assert_one_line_error(run_on(command, built.path), 2, "format version 99")


def test_an_unreadable_data_file_is_an_operational_failure(tmp_path: Path) -> None:
    store = tmp_path / "broken"
    store.mkdir()
    (store / "data.mdb").write_bytes(b"not lmdb" * 1024)
    assert_one_line_error(run("stat", store), 1, "cannot be read")


@pytest.mark.parametrize(
    "command",
    [["ls", "{store}"], ["verify", "{store}"], ["show", "{store}", "01"], ["rm", "{store}", "-y"]],
    ids=lambda c: c[0],
)
def test_an_unknown_namespace(built: BuiltStore, command: list[str]) -> None:
    result = run_on(command, built.path, "--namespace", "nope")
    assert_one_line_error(result, 2, "unknown namespace 'nope'", TP1)


def test_an_ambiguous_namespace_prefix(built: BuiltStore) -> None:
    assert_one_line_error(run("ls", built.path, "--namespace", "a1b2"), 2, "matches 2")


@pytest.mark.parametrize("command", ["show", "rm"])
def test_a_key_prefix_matching_several_lists_candidates(built: BuiltStore, command: str) -> None:
    extra = ("--yes",) if command == "rm" else ()
    result = run(command, built.path, "00", *extra)
    assert_one_line_error(result, 2, "matches 4 chunks", "give more digits")
    assert built.keys[TP1][0].hex()[:16] in result.stderr


@pytest.mark.parametrize("prefix", ["ff", "0009"])
def test_a_key_prefix_matching_nothing(built: BuiltStore, prefix: str) -> None:
    assert_one_line_error(
        run("show", built.path, prefix), 2, f"no chunk key starts with {prefix!r}"
    )


def test_a_prefix_matching_nothing_in_the_given_namespace(built: BuiltStore) -> None:
    prefix = built.keys[TP1][0].hex()[:6]
    assert_one_line_error(run("show", built.path, prefix, "--namespace", BARE), 2, "no chunk key")


@pytest.mark.parametrize("prefix", ["xyz", "0g"])
def test_a_key_that_is_not_hex(built: BuiltStore, prefix: str) -> None:
    assert_one_line_error(run("show", built.path, prefix), 2, "not hexadecimal")


@pytest.mark.parametrize("size", ["lots", "12QB", "-5"])
def test_a_bad_size_string(built: BuiltStore, size: str) -> None:
    result = run("gc", built.path, "--max-bytes", size, "--yes")
    assert_one_line_error(result, 2, "--max-bytes")


def test_an_unknown_sort_is_a_usage_error(built: BuiltStore) -> None:
    result = run("ls", built.path, "--sort", "colour")
    assert result.exit_code == 2
    assert result.stdout == ""
