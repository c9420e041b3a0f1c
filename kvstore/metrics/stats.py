"""Transfer statistics a worker process accumulates and the scheduler merges into the metrics.

Workers move the bytes but own no exporter; each step the connector takes the worker's
`TransferStats` (`TransferStatsAccumulator.take()`), carries `to_dict()` over vLLM's
worker→scheduler channel, and the scheduler calls `KVStoreMetrics.record_transfer_stats`.

Durations and sizes travel as bucket counts on the metrics' own bucket bounds, so the value stays
small however many transfers a step made, and merging is exact.
"""

from __future__ import annotations

import threading
from bisect import bisect_left
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kvstore.errors import KVStoreError
from kvstore.metrics.labels import DURATION_BUCKETS_S, SIZE_BUCKETS_BYTES, Direction

__all__ = ["DirectionStats", "StatsFormatError", "TransferStats", "TransferStatsAccumulator"]

_NUM_DURATION_BUCKETS = len(DURATION_BUCKETS_S) + 1  # the last one is +Inf
_NUM_SIZE_BUCKETS = len(SIZE_BUCKETS_BYTES) + 1


class StatsFormatError(KVStoreError, ValueError):
    """A `TransferStats.from_dict` input that is not what `to_dict` writes."""


def _add(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(x + y for x, y in zip(a, b, strict=True))


@dataclass(frozen=True, slots=True)
class DirectionStats:
    """Transfers in one direction: counts, bytes moved and bucketed durations and sizes.

    `duration_buckets[i]` counts successful transfers with `duration <= DURATION_BUCKETS_S[i]`
    that did not fit an earlier bucket (the last entry is +Inf); `size_buckets` likewise.
    Failed transfers count in `num_failed` only.
    """

    num_ok: int = 0
    num_failed: int = 0
    num_bytes: int = 0
    duration_sum_s: float = 0.0
    duration_buckets: tuple[int, ...] = (0,) * _NUM_DURATION_BUCKETS
    size_buckets: tuple[int, ...] = (0,) * _NUM_SIZE_BUCKETS

    def merge(self, other: DirectionStats) -> DirectionStats:
        return DirectionStats(
            num_ok=self.num_ok + other.num_ok,
            num_failed=self.num_failed + other.num_failed,
            num_bytes=self.num_bytes + other.num_bytes,
            duration_sum_s=self.duration_sum_s + other.duration_sum_s,
            duration_buckets=_add(self.duration_buckets, other.duration_buckets),
            size_buckets=_add(self.size_buckets, other.size_buckets),
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "num_ok": self.num_ok,
            "num_failed": self.num_failed,
            "num_bytes": self.num_bytes,
            "duration_sum_s": self.duration_sum_s,
            "duration_buckets": list(self.duration_buckets),
            "size_buckets": list(self.size_buckets),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> DirectionStats:
        try:
            stats = cls(
                num_ok=int(data["num_ok"]),
                num_failed=int(data["num_failed"]),
                num_bytes=int(data["num_bytes"]),
                duration_sum_s=float(data["duration_sum_s"]),
                duration_buckets=tuple(int(n) for n in data["duration_buckets"]),
                size_buckets=tuple(int(n) for n in data["size_buckets"]),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise StatsFormatError(f"bad direction stats {dict(data)!r}: {exc}") from exc
        if len(stats.duration_buckets) != _NUM_DURATION_BUCKETS:
            raise StatsFormatError(
                f"duration_buckets has {len(stats.duration_buckets)} entries, "
                f"expected {_NUM_DURATION_BUCKETS}"
            )
        if len(stats.size_buckets) != _NUM_SIZE_BUCKETS:
            raise StatsFormatError(
                f"size_buckets has {len(stats.size_buckets)} entries, expected {_NUM_SIZE_BUCKETS}"
            )
        return stats


@dataclass(frozen=True, slots=True)
class TransferStats:
    """Per-direction transfer statistics; directions without transfers are absent.

    A value: `merge` returns a new one. `to_dict`/`from_dict` round-trip through JSON, msgpack or
    any serializer vLLM uses (plain ints, floats, strings and lists).
    """

    by_direction: Mapping[Direction, DirectionStats] = field(default_factory=dict)

    @property
    def is_empty(self) -> bool:
        return not self.by_direction

    def merge(self, other: TransferStats) -> TransferStats:
        merged = dict(self.by_direction)
        for direction, stats in other.by_direction.items():
            mine = merged.get(direction)
            merged[direction] = stats if mine is None else mine.merge(stats)
        return TransferStats(merged)

    def to_dict(self) -> dict[str, Any]:
        return {str(d): s.to_dict() for d, s in self.by_direction.items()}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TransferStats:
        by_direction: dict[Direction, DirectionStats] = {}
        for name, value in data.items():
            try:
                direction = Direction(name)
            except ValueError as exc:
                allowed = ", ".join(d.value for d in Direction)
                raise StatsFormatError(
                    f"unknown transfer direction {name!r}; allowed: {allowed}"
                ) from exc
            by_direction[direction] = DirectionStats.from_dict(value)
        return cls(by_direction)


class _MutableDirection:
    __slots__ = (
        "duration_buckets",
        "duration_sum_s",
        "num_bytes",
        "num_failed",
        "num_ok",
        "size_buckets",
    )

    def __init__(self) -> None:
        self.num_ok = 0
        self.num_failed = 0
        self.num_bytes = 0
        self.duration_sum_s = 0.0
        self.duration_buckets = [0] * _NUM_DURATION_BUCKETS
        self.size_buckets = [0] * _NUM_SIZE_BUCKETS

    def add(self, other: DirectionStats) -> None:
        self.num_ok += other.num_ok
        self.num_failed += other.num_failed
        self.num_bytes += other.num_bytes
        self.duration_sum_s += other.duration_sum_s
        for i, n in enumerate(other.duration_buckets):
            self.duration_buckets[i] += n
        for i, n in enumerate(other.size_buckets):
            self.size_buckets[i] += n

    def freeze(self) -> DirectionStats:
        return DirectionStats(
            num_ok=self.num_ok,
            num_failed=self.num_failed,
            num_bytes=self.num_bytes,
            duration_sum_s=self.duration_sum_s,
            duration_buckets=tuple(self.duration_buckets),
            size_buckets=tuple(self.size_buckets),
        )


class TransferStatsAccumulator:
    """Collects transfers as they finish; `take()` swaps the collected stats out.

    Thread-safe: transfer threads call `observe`, the connector calls `take` once per step.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_direction: dict[Direction, _MutableDirection] = {}

    def observe(self, direction: Direction, num_bytes: int, duration_s: float, ok: bool) -> None:
        with self._lock:
            acc = self._by_direction.get(direction)
            if acc is None:
                acc = self._by_direction[direction] = _MutableDirection()
            if not ok:
                acc.num_failed += 1
                return
            acc.num_ok += 1
            acc.num_bytes += num_bytes
            acc.duration_sum_s += duration_s
            acc.duration_buckets[bisect_left(DURATION_BUCKETS_S, duration_s)] += 1
            acc.size_buckets[bisect_left(SIZE_BUCKETS_BYTES, num_bytes)] += 1

    def add(self, stats: TransferStats) -> None:
        """Fold in stats taken elsewhere (another worker's, say)."""
        with self._lock:
            for direction, other in stats.by_direction.items():
                acc = self._by_direction.get(direction)
                if acc is None:
                    acc = self._by_direction[direction] = _MutableDirection()
                acc.add(other)

    def snapshot(self) -> TransferStats:
        """The stats so far, without resetting them."""
        with self._lock:
            return TransferStats({d: acc.freeze() for d, acc in self._by_direction.items()})

    def take(self) -> TransferStats:
        """The stats so far; the accumulator starts again from zero."""
        with self._lock:
            taken, self._by_direction = self._by_direction, {}
        return TransferStats({d: acc.freeze() for d, acc in taken.items()})
