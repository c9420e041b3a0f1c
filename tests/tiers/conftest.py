from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from tiers_testlib import CAPACITY_BYTES, StoreHarness

from tiers.lmdb import LMDBStore


@pytest.fixture(params=["memory", "lmdb"])
def harness(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[StoreHarness]:
    made = StoreHarness(request.param, tmp_path)
    yield made
    made.store.close()


@pytest.fixture
def open_store(tmp_path: Path) -> Iterator[Callable[..., LMDBStore]]:
    opened: list[LMDBStore] = []

    def _open(**kwargs: object) -> LMDBStore:
        kwargs.setdefault("capacity_bytes", CAPACITY_BYTES)
        store = LMDBStore.open(tmp_path / "store", **kwargs)  # type: ignore[arg-type]
        opened.append(store)
        return store

    yield _open
    for store in opened:
        store.close()
