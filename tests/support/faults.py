"""Faults planted on purpose, to prove the oracles catch them (no vLLM import here)."""

from __future__ import annotations

from typing import Any

from kvstore.keys import BlockKey, Tier

__all__ = ["cpu_rows_of", "damage_cpu_rows", "swap_cpu_rows"]


def cpu_rows_of(runtime: Any, keys: list[BlockKey]) -> list[int]:
    """The CPU rows holding `keys` (ready in the CPU tier), read through the index's API."""
    index = runtime.index
    plan = index.prepare_load(keys)
    index.complete_load(plan.keys)
    assert not plan.missing, f"{len(plan.missing)} chunk(s) are not in the CPU tier"
    return list(plan.rows)


def damage_cpu_rows(runtime: Any, num_rows: int) -> int:
    """Flip bytes in up to `num_rows` CPU rows of ready chunks, after their store completed
    (and after the load audit took their digests). Returns how many rows were damaged."""
    keys = sorted(runtime.index.ready_keys(Tier.CPU))[:num_rows]
    region = runtime.region
    for row in cpu_rows_of(runtime, keys):
        view = region.row(row)
        for offset in range(0, len(view), max(1, len(view) // 8)):
            view[offset] ^= 0x5A
    return len(keys)


def swap_cpu_rows(runtime: Any, first: list[BlockKey], second: list[BlockKey]) -> None:
    """Exchange the bytes of the rows of `first[i]` and `second[i]`: valid KV, wrong chunk."""
    region = runtime.region
    for a, b in zip(cpu_rows_of(runtime, first), cpu_rows_of(runtime, second), strict=True):
        saved = bytes(region.row(a))
        region.row(a)[:] = region.row(b)
        region.row(b)[:] = saved
