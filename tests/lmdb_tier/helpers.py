"""Helpers of the LMDBTier tests: building vLLM's offloading config and spec, keys, jobs."""

from __future__ import annotations

import hashlib
import time
import weakref
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import lmdb
import numpy as np
from vllm.v1.kv_offload.base import OffloadingEvent, OffloadKey, ReqContext, make_offload_key
from vllm.v1.kv_offload.config import (
    OffloadingCacheConfig,
    OffloadingConfig,
    OffloadingGroupConfig,
    OffloadingModelConfig,
    OffloadingParallelConfig,
)
from vllm.v1.kv_offload.tiering.base import JobResult, TransferJob
from vllm.v1.kv_offload.tiering.spec import TieringOffloadingSpec

from kvstore.vllm import LMDBTier

SLOT_BYTES = 4096
NUM_SLOTS = 16
TOKENS_PER_BLOCK = 16
LAYER_NAMES = ("model.layers.0.self_attn.attn", "model.layers.1.self_attn.attn")


def offloading_config(
    *,
    dtype: str = "bfloat16",
    enable_events: bool = True,
    extra: dict[str, Any] | None = None,
    engine_id: str = "lmdb-tier-test",
) -> OffloadingConfig:
    """What `build_offloading_config` makes of a one-group, TP1 engine (2 KiB per block)."""
    return OffloadingConfig(
        groups=(OffloadingGroupConfig(TOKENS_PER_BLOCK, LAYER_NAMES, 0),),
        worker_kv_bytes_per_block=SLOT_BYTES,
        enable_kv_cache_events=enable_events,
        extra_config={"cpu_bytes_to_use": NUM_SLOTS * SLOT_BYTES, **(extra or {})},
        engine_id=engine_id,
        model=OffloadingModelConfig(name="tiny-llama", dtype=dtype),
        cache=OffloadingCacheConfig(tokens_per_hash=TOKENS_PER_BLOCK, blocks_per_chunk=1),
        parallel=OffloadingParallelConfig(
            rank=0,
            world_size=1,
            tp_size=1,
            pp_size=1,
            pcp_size=1,
            dcp_size=1,
            data_parallel_index=0,
            data_parallel_size=1,
            data_parallel_rank_local=None,
            is_parallelism_agnostic=True,
        ),
        kv_cache_layout="NHD",
    )


def tiering_spec(**kwargs: Any) -> TieringOffloadingSpec:
    return TieringOffloadingSpec(offloading_config(**kwargs))


def key(i: int, group: int = 0) -> OffloadKey:
    return make_offload_key(hashlib.sha256(f"chunk-{i}".encode()).digest(), group)


def fill(primary: np.ndarray, slot: int, seed: int) -> bytes:
    """Random bytes in `slot`; returns them."""
    primary[slot] = np.random.default_rng(seed).integers(0, 256, SLOT_BYTES, dtype=np.uint8)
    return primary[slot].tobytes()


def job(
    job_id: int, keys: Sequence[OffloadKey], slots: Sequence[int], *, is_promotion: bool = False
) -> TransferJob:
    return TransferJob(
        job_id=job_id,
        keys=list(keys),
        chunk_ids=np.array(slots, dtype=np.int32),
        is_promotion=is_promotion,
        req_context=ReqContext(req_id=f"req-{job_id}"),
    )


_UNCLAIMED: weakref.WeakKeyDictionary[LMDBTier, dict[int, JobResult]] = weakref.WeakKeyDictionary()


def finish(tier: LMDBTier, *job_ids: int, timeout_s: float = 10.0) -> dict[int, JobResult]:
    """Poll `get_finished_jobs` (as vLLM does each step) until every job has finished; other
    jobs' results are kept for a later call."""
    results = _UNCLAIMED.setdefault(tier, {})
    deadline = time.monotonic() + timeout_s
    while set(job_ids) - results.keys():
        assert time.monotonic() < deadline, f"jobs {set(job_ids) - results.keys()} never finished"
        for result in tier.get_finished_jobs():
            assert result.job_id not in results, f"job {result.job_id} finished twice"
            results[result.job_id] = result
        time.sleep(0.002)
    return {job_id: results.pop(job_id) for job_id in job_ids}


def stored_and_removed(events: Iterable[OffloadingEvent]) -> tuple[list[bytes], list[bytes]]:
    stored: list[bytes] = []
    removed: list[bytes] = []
    for event in events:
        (removed if event.removed else stored).extend(event.keys)
    return stored, removed


def metric(tier: LMDBTier, name: str, /, **labels: str) -> float:
    return tier.registry.get_sample_value(name, labels) or 0.0


@dataclass
class Harness:
    """Opens tiers on one store path the way `SecondaryTierFactory` does; closes them all."""

    spec: TieringOffloadingSpec
    primary: np.ndarray
    path: Path
    tiers: list[LMDBTier] = field(default_factory=list)

    def open(self, spec: TieringOffloadingSpec | None = None, **options: Any) -> LMDBTier:
        options.setdefault("path", str(self.path))
        options.setdefault("capacity_bytes", 64 * SLOT_BYTES)
        tier = LMDBTier(spec or self.spec, memoryview(self.primary), "LMDBTier", None, **options)
        self.tiers.append(tier)
        return tier

    def store(self, tier: LMDBTier, job_id: int, first: int, count: int) -> dict[bytes, bytes]:
        """Store keys `first..first+count-1` from slots 0.. (random bytes); returns their values."""
        keys = [key(i) for i in range(first, first + count)]
        values = {k: fill(self.primary, slot, seed=first + slot) for slot, k in enumerate(keys)}
        tier.submit_store(job(job_id, keys, range(count)))
        assert finish(tier, job_id)[job_id].success
        return values

    def close_all(self) -> None:
        for tier in self.tiers:
            tier.shutdown()
        self.tiers.clear()


def flip_stored_byte(path: Path, chunk_key: bytes, offset: int = 100) -> None:
    """Flip one byte of `chunk_key`'s value with a raw LMDB write into DB `data` (the layout of
    `tiers/lmdb.py`: internal key = 4-byte namespace ordinal + key). The store must be closed."""
    env = lmdb.open(str(path), max_dbs=8, subdir=True)
    try:
        data_db = env.open_db(b"data")
        with env.begin(write=True) as txn:
            for internal_key, value in txn.cursor(db=data_db):
                if bytes(internal_key)[4:] == chunk_key:
                    damaged = bytearray(value)
                    damaged[offset] ^= 0x01
                    txn.put(bytes(internal_key), bytes(damaged), db=data_db)
                    return
        raise AssertionError(f"chunk {chunk_key.hex()[:12]} is not in {path}")
    finally:
        env.close()
