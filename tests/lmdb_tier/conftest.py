"""Fixtures of the LMDBTier tests: a real `TieringOffloadingSpec`, a primary tier as a numpy array
of slots, and a harness that opens tiers the way vLLM's factory does and shuts them down."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from .helpers import NUM_SLOTS, SLOT_BYTES, Harness, tiering_spec


@pytest.fixture
def primary() -> np.ndarray:
    """The primary CPU tier: `NUM_SLOTS` slots of `SLOT_BYTES` bytes."""
    return np.zeros((NUM_SLOTS, SLOT_BYTES), dtype=np.uint8)


@pytest.fixture
def harness(tmp_path: Path, primary: np.ndarray) -> Iterator[Harness]:
    harness = Harness(tiering_spec(), primary, tmp_path / "store")
    yield harness
    harness.close_all()
