"""TransferStats: the worker-side value merges exactly and round-trips through plain data."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvstore.metrics import (
    Direction,
    StatsFormatError,
    TransferStats,
    TransferStatsAccumulator,
)

observations = st.lists(
    st.tuples(
        st.sampled_from(list(Direction)),
        st.integers(0, 1 << 31),
        st.floats(0, 20, allow_nan=False),
        st.booleans(),
    ),
    max_size=30,
)


def accumulate(obs: list[tuple[Direction, int, float, bool]]) -> TransferStats:
    acc = TransferStatsAccumulator()
    for direction, size, duration, ok in obs:
        acc.observe(direction, size, duration, ok)
    return acc.take()


def normalised(stats: TransferStats) -> dict[str, object]:
    """to_dict with float sums rounded (merge order changes the last bits)."""
    data = stats.to_dict()
    for entry in data.values():
        entry["duration_sum_s"] = round(entry["duration_sum_s"], 9)
    return data


@given(observations, observations, observations)
def test_merge_is_associative_commutative_and_matches_one_accumulator(a, b, c) -> None:  # type: ignore[no-untyped-def]
    sa, sb, sc = accumulate(a), accumulate(b), accumulate(c)
    assert normalised(sa.merge(sb).merge(sc)) == normalised(sa.merge(sb.merge(sc)))
    assert normalised(sa.merge(sb)) == normalised(sb.merge(sa))
    assert normalised(sa.merge(sb).merge(sc)) == normalised(accumulate(a + b + c))


@given(observations)
def test_round_trips_through_json(obs) -> None:  # type: ignore[no-untyped-def]
    stats = accumulate(obs)
    assert TransferStats.from_dict(json.loads(json.dumps(stats.to_dict()))) == stats


def test_counts_failures_apart_and_take_resets() -> None:
    acc = TransferStatsAccumulator()
    acc.observe(Direction.DISK_TO_CPU, 100, 0.5, ok=False)
    acc.observe(Direction.DISK_TO_CPU, 100, 0.5, ok=True)
    stats = acc.take()
    d = stats.by_direction[Direction.DISK_TO_CPU]
    assert (d.num_ok, d.num_failed, d.num_bytes) == (1, 1, 100)
    assert sum(d.duration_buckets) == 1
    assert acc.take().is_empty
    assert TransferStats().merge(stats) == stats


@pytest.mark.parametrize(
    "data, match",
    [
        ({"sideways": {}}, "unknown transfer direction 'sideways'"),
        ({"cpu_to_disk": {"num_ok": 1}}, "bad direction stats"),
        (
            {
                "cpu_to_disk": {
                    "num_ok": 0,
                    "num_failed": 0,
                    "num_bytes": 0,
                    "duration_sum_s": 0.0,
                    "duration_buckets": [0],
                    "size_buckets": [0] * 11,
                }
            },
            "duration_buckets has 1 entries",
        ),
    ],
)
def test_from_dict_rejects_what_to_dict_never_writes(data: dict[str, object], match: str) -> None:
    with pytest.raises(StatsFormatError, match=match):
        TransferStats.from_dict(data)
