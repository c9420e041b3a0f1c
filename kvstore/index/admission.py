"""The admission filter: write a chunk to disk only after it was seen N times."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable

from kvstore.keys import BlockKey

__all__ = ["SightingCounter"]


class SightingCounter:
    """Counts sightings per key, remembering at most `max_keys` keys (least recently seen go).

    A forgotten key starts again from zero, so the filter errs toward not writing.
    """

    __slots__ = ("_counts", "_max_keys", "_min_sightings")

    def __init__(self, min_sightings: int, max_keys: int) -> None:
        if min_sightings < 1:
            raise ValueError(f"min_sightings must be >= 1, got {min_sightings}")
        if max_keys < 1:
            raise ValueError(f"max_keys must be >= 1, got {max_keys}")
        self._min_sightings = min_sightings
        self._max_keys = max_keys
        self._counts: OrderedDict[BlockKey, int] = OrderedDict()

    def __len__(self) -> int:
        return len(self._counts)

    def record(self, keys: Iterable[BlockKey]) -> list[BlockKey]:
        """Count one sighting of each key; returns the keys admitted by this very sighting."""
        counts = self._counts
        admitted: list[BlockKey] = []
        for key in keys:
            count = counts.pop(key, 0) + 1
            counts[key] = count
            if count == self._min_sightings:
                admitted.append(key)
        while len(counts) > self._max_keys:
            counts.popitem(last=False)
        return admitted

    def is_admitted(self, key: BlockKey) -> bool:
        return self._counts.get(key, 0) >= self._min_sightings
