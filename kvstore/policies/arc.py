"""Adaptive Replacement Cache (Megiddo & Modha, FAST 2003).

    T1  keys seen once recently          B1  ghosts: keys recently evicted from T1
    T2  keys seen at least twice         B2  ghosts: keys recently evicted from T2

A new key enters T1; an access to a key in T1 or T2 moves it to the MRU end of T2. Inserting a key
that is a ghost adapts the target size `p` of T1 (a B1 ghost means recency was undervalued: grow
`p`; a B2 ghost: shrink it) and puts the key straight into T2. Eviction takes T1's LRU end while
T1 is larger than `p`, else T2's, and remembers the victim as a ghost. Ghost lists are bounded by
the capacity: |T1| + |B1| <= c and |B1| + |B2| <= c.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Container, Iterator

from kvstore.keys import BlockKey
from kvstore.policies.base import choose_victims

__all__ = ["ARCPolicy"]


class ARCPolicy:
    """ARC over the keys of one tier; `capacity` is the tier's size in keys. Not thread-safe."""

    __slots__ = ("_b1", "_b2", "_capacity", "_t1", "_t2", "_target_t1")

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"ARC capacity must be >= 1 key, got {capacity}")
        self._capacity = capacity
        self._target_t1 = 0.0
        # Each OrderedDict is oldest first.
        self._t1: OrderedDict[BlockKey, None] = OrderedDict()
        self._t2: OrderedDict[BlockKey, None] = OrderedDict()
        self._b1: OrderedDict[BlockKey, None] = OrderedDict()
        self._b2: OrderedDict[BlockKey, None] = OrderedDict()

    @property
    def name(self) -> str:
        return "arc"

    @property
    def capacity(self) -> int:
        return self._capacity

    @property
    def target_t1_size(self) -> float:
        """ARC's adaptive target `p` for T1, in keys."""
        return self._target_t1

    @property
    def num_ghosts(self) -> int:
        return len(self._b1) + len(self._b2)

    def __len__(self) -> int:
        return len(self._t1) + len(self._t2)

    def __contains__(self, key: object) -> bool:
        return key in self._t1 or key in self._t2

    def __repr__(self) -> str:
        return (
            f"ARCPolicy(t1={len(self._t1)}, t2={len(self._t2)}, b1={len(self._b1)}, "
            f"b2={len(self._b2)}, p={self._target_t1:.1f}, capacity={self._capacity})"
        )

    def insert(self, key: BlockKey) -> None:
        if key in self._t1 or key in self._t2:
            self.touch(key)
            return
        if key in self._b1:
            step = max(1.0, len(self._b2) / len(self._b1))
            self._target_t1 = min(float(self._capacity), self._target_t1 + step)
            del self._b1[key]
            self._t2[key] = None
        elif key in self._b2:
            step = max(1.0, len(self._b1) / len(self._b2))
            self._target_t1 = max(0.0, self._target_t1 - step)
            del self._b2[key]
            self._t2[key] = None
        else:
            self._t1[key] = None
            # T1 grew by one: keep |T1| + |B1| <= c (a ghost hit only shrinks the ghost lists).
            if self._b1 and len(self._t1) + len(self._b1) > self._capacity:
                self._b1.popitem(last=False)

    def touch(self, key: BlockKey) -> None:
        if key in self._t1:
            del self._t1[key]
            self._t2[key] = None
        elif key in self._t2:
            self._t2.move_to_end(key)

    def remove(self, key: BlockKey) -> bool:
        for keys in (self._t1, self._t2):
            if key in keys:
                del keys[key]
                return True
        return False

    def victims(self, protected: Container[BlockKey]) -> Iterator[BlockKey]:
        # Simulate T1 shrinking as victims are chosen; both walks are monotonic, so taking k
        # victims costs O(k + protected keys skipped), never a rescan from the LRU end.
        t1_free = (key for key in self._t1 if key not in protected)
        t2_free = (key for key in self._t2 if key not in protected)
        num_t1 = len(self._t1)
        while True:
            is_from_t1 = num_t1 > 0 and num_t1 > self._target_t1
            key = next(t1_free, None) if is_from_t1 else None
            if key is None:
                key, is_from_t1 = next(t2_free, None), False
            if key is None:
                key, is_from_t1 = next(t1_free, None), True
            if key is None:
                return
            if is_from_t1:
                num_t1 -= 1
            yield key

    def evict(self, n: int, protected: Container[BlockKey]) -> list[BlockKey] | None:
        chosen = choose_victims(self, n, protected)
        if not chosen:
            return chosen
        for key in chosen:
            if key in self._t1:
                del self._t1[key]
                self._b1[key] = None
            else:
                del self._t2[key]
                self._b2[key] = None
        self._trim_ghosts()
        return chosen

    def _trim_ghosts(self) -> None:
        b1, b2 = self._b1, self._b2
        if not b1 and not b2:
            return
        capacity = self._capacity
        for _ in range(min(len(b1), len(self._t1) + len(b1) - capacity)):
            b1.popitem(last=False)
        for _ in range(len(b1) + len(b2) - capacity):
            (b2 if b2 else b1).popitem(last=False)
