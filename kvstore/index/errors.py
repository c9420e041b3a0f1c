"""Errors raised by the tier index (both derive from `kvstore.errors.KVStoreError`).

    KVStoreError
    ├── IndexStateError   a caller completed or released something that is not in flight
    └── InvariantError    `check_invariants` found the index inconsistent (also an AssertionError)

Expected outcomes (tier full, nothing evictable, key not present) are return values, not errors.
"""

from __future__ import annotations

from kvstore.errors import KVStoreError

__all__ = ["IndexStateError", "InvariantError"]


class IndexStateError(KVStoreError, RuntimeError):
    """An operation does not match the index's state: a bug in the caller."""


class InvariantError(KVStoreError, AssertionError):
    """The index broke one of its invariants: a bug in the index."""
