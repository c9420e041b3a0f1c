"""Least-recently-used eviction: an OrderedDict with `move_to_end`."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Container, Iterator

from kvstore.keys import BlockKey
from kvstore.policies.base import choose_victims

__all__ = ["LRUPolicy"]


class LRUPolicy:
    """Evicts the key accessed longest ago. Not thread-safe.

    `capacity` is accepted for a uniform factory signature; LRU keeps no history, so it needs none.
    """

    __slots__ = ("_order",)

    def __init__(self, capacity: int = 0) -> None:
        del capacity
        # Oldest first: iteration order is eviction order.
        self._order: OrderedDict[BlockKey, None] = OrderedDict()

    @property
    def name(self) -> str:
        return "lru"

    def __len__(self) -> int:
        return len(self._order)

    def __contains__(self, key: object) -> bool:
        return key in self._order

    def __repr__(self) -> str:
        return f"LRUPolicy(num_keys={len(self._order)})"

    def insert(self, key: BlockKey) -> None:
        if key in self._order:
            self._order.move_to_end(key)
        else:
            self._order[key] = None

    def touch(self, key: BlockKey) -> None:
        if key in self._order:
            self._order.move_to_end(key)

    def remove(self, key: BlockKey) -> bool:
        try:
            del self._order[key]
        except KeyError:
            return False
        return True

    def victims(self, protected: Container[BlockKey]) -> Iterator[BlockKey]:
        for key in self._order:
            if key not in protected:
                yield key

    def evict(self, n: int, protected: Container[BlockKey]) -> list[BlockKey] | None:
        chosen = choose_victims(self, n, protected)
        if not chosen:
            return chosen
        order = self._order
        for key in chosen:
            del order[key]
        return chosen
