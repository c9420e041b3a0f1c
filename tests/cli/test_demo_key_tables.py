"""Tables of keys keep the 16-hex short key whole when stdout is not a terminal (CliRunner's is
not: rich assumes 80 columns there); the other columns wrap instead."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import lmdb

from kvstore.cli._common import SHORT_KEY_CHARS, short_key

from .helpers import TP2, BuiltStore, flip_byte, run

_ROW = re.compile(r"^ ([0-9a-f]\S*) ", re.MULTILINE)


def test_short_key_is_16_hex_digits() -> None:
    assert short_key(bytes(range(32))) == "000102030405060708090a0b0c0d0e0f"[:SHORT_KEY_CHARS]
    assert len(short_key(bytes(32))) == SHORT_KEY_CHARS == 16


def test_verify_table_keeps_the_whole_short_key(
    built: BuiltStore, raw_env: Callable[[Path], lmdb.Environment]
) -> None:
    bad_keys = built.keys[TP2][:2]
    env = raw_env(built.path)
    for key in bad_keys:
        flip_byte(env, TP2, key)
    env.close()

    result = run("verify", built.path)

    assert result.exit_code == 1
    shown = _ROW.findall(result.stdout)  # the first cell of each row, not the error text
    assert shown == [short_key(key) for key in bad_keys], result.stdout
    assert "…" not in result.stdout
    assert TP2 in result.stdout.replace("\n", "")  # the namespace is there, wrapped if need be


def test_ls_table_keeps_the_whole_short_key(built: BuiltStore) -> None:
    result = run("ls", built.path, "--sort", "key")

    assert result.exit_code == 0
    all_keys = sorted(key for keys in built.keys.values() for key in keys)
    assert _ROW.findall(result.stdout) == [short_key(key) for key in all_keys], result.stdout
    assert "…" not in result.stdout
    rows = [line for line in result.stdout.splitlines() if _ROW.match(line)]
    assert all(line.rstrip().endswith("unverified") for line in rows)  # one line per chunk
