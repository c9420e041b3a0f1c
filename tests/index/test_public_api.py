"""The curated public surface of `kvstore.index` and `kvstore.policies`."""

from __future__ import annotations

import kvstore.index
import kvstore.policies


def test_index_exports_resolve() -> None:
    for name in kvstore.index.__all__:
        assert getattr(kvstore.index, name) is not None
    assert "TierIndex" in kvstore.index.__all__
    assert all(not name.startswith("_") for name in kvstore.index.__all__)


def test_policy_exports_resolve() -> None:
    for name in kvstore.policies.__all__:
        assert getattr(kvstore.policies, name) is not None
    assert set(kvstore.policies.POLICY_NAMES) == {"lru", "arc"}


def test_threading_contract_is_documented_on_the_class() -> None:
    doc = kvstore.index.TierIndex.__doc__ or ""
    assert "NOT thread-safe" in doc
