"""The eviction-policy plug point.

A policy only orders the keys of one tier and chooses victims; the tier that owns it does the size
accounting, the pins and the entry states (as in cachetools, where the base class accounts and each
policy only chooses). The tier tells the policy which keys it may not evict through `protected`, a
container whose `in` is O(1); a policy skips those as it walks from its eviction end, so it never
scans the whole population unless nearly everything is protected.
"""

from __future__ import annotations

from collections.abc import Container, Iterator
from itertools import islice
from typing import Protocol, runtime_checkable

from kvstore.keys import BlockKey

__all__ = ["EvictionPolicy", "choose_victims"]


@runtime_checkable
class EvictionPolicy(Protocol):
    """Orders the keys of one tier for eviction.

    A key enters with `insert`, leaves with `remove` (no history kept) or `evict` (the policy may
    remember it, as ARC's ghost lists do). Not thread-safe; the tier's owner serializes calls.
    """

    @property
    def name(self) -> str:
        """The name `make_policy` knows this policy by."""
        ...

    def __len__(self) -> int: ...

    def __contains__(self, key: object) -> bool: ...

    def insert(self, key: BlockKey) -> None:
        """Add a new key (a key already held counts as an access, like `touch`)."""
        ...

    def touch(self, key: BlockKey) -> None:
        """Record an access to a held key; a key not held is ignored."""
        ...

    def remove(self, key: BlockKey) -> bool:
        """Forget a key without evicting it (no history). Returns whether it was held."""
        ...

    def victims(self, protected: Container[BlockKey]) -> Iterator[BlockKey]:
        """The keys `evict` would choose, in order, skipping `protected`; changes nothing.

        Lazy: take only as many as needed. Invalid once the policy changes. For any n,
        `evict(n, protected)` returns the first n keys this yields, given the same state.
        """
        ...

    def evict(self, n: int, protected: Container[BlockKey]) -> list[BlockKey] | None:
        """Remove and return exactly `n` keys, none of them in `protected`.

        Atomic: returns None and changes nothing when fewer than `n` keys can be evicted.
        """
        ...


def choose_victims(
    policy: EvictionPolicy, n: int, protected: Container[BlockKey]
) -> list[BlockKey] | None:
    """The first `n` of `policy.victims(protected)`, or None when there are fewer: the shared
    half of every policy's atomic `evict` (each then drops the chosen keys its own way)."""
    if n < 0:
        raise ValueError(f"number of keys to evict must be >= 0, got {n}")
    chosen = list(islice(policy.victims(protected), n))
    return chosen if len(chosen) == n else None
