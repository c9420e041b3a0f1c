"""Faults planted on purpose, to prove the oracles catch them (vLLM is imported only by
`plant_wrong_block_ids`, when called)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from kvstore.keys import BlockKey, Tier
from kvstore.transfer.jobs import CopyJob

__all__ = ["cpu_rows_of", "damage_cpu_rows", "plant_wrong_block_ids", "swap_cpu_rows"]


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


def _rotated(job: CopyJob) -> CopyJob:
    """The job with each chunk's block ids taken from the next chunk's (valid blocks of the
    same request, holding another position's KV); a one-chunk job is left alone."""
    segments = job.segments
    rotated = [
        dataclasses.replace(s, block_ids=segments[(i + 1) % len(segments)].block_ids)
        for i, s in enumerate(segments)
    ]
    return dataclasses.replace(job, segments=tuple(rotated))


def plant_wrong_block_ids(monkeypatch: pytest.MonkeyPatch, kind: str) -> None:
    """Make every in-process worker copy from/to the wrong engine blocks: `kind="store"`
    gathers each chunk of a store job from the next chunk's blocks, `kind="load"` scatters each
    chunk of a load job into them. The jobs' rows, keys and digests stay right."""
    from kvstore.vllm.worker import ConnectorWorker

    method, field = {"store": ("wait_for_save", "store_jobs"),
                     "load": ("start_load_kv", "load_jobs")}[kind]  # fmt: skip
    original = getattr(ConnectorWorker, method)

    def faulty(self: Any, meta: Any) -> None:
        jobs = [_rotated(job) for job in getattr(meta, field)]
        original(self, dataclasses.replace(meta, **{field: jobs}))

    monkeypatch.setattr(ConnectorWorker, method, faulty)
