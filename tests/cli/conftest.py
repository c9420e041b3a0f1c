"""Fixtures of the CLI tests (see `helpers` for the store they build)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import lmdb
import pytest

from .helpers import BuiltStore, build_store


@pytest.fixture
def built(tmp_path: Path) -> BuiltStore:
    return build_store(tmp_path / "store")


@pytest.fixture
def raw_env() -> Iterator[Callable[[Path], lmdb.Environment]]:
    """Opens a store's LMDB environment directly (close it before the next CLI run)."""
    opened: list[lmdb.Environment] = []

    def open_env(path: Path) -> lmdb.Environment:
        env = lmdb.open(str(path), max_dbs=8, subdir=True)
        opened.append(env)
        return env

    yield open_env
    for env in opened:
        env.close()
