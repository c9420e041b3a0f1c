"""LMDBTier under vLLM's real `TieringOffloadingManager` (built by `TieringOffloadingSpec` from the
same `secondary_tiers` config a user passes), with its real primary CPU tier. The GPU side is
simulated by writing the primary slots that `prepare_store` hands out."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import pytest
from vllm.v1.kv_offload.base import (
    LookupResult,
    Medium,
    OffloadKey,
    ReqContext,
    ScheduleEndContext,
)
from vllm.v1.kv_offload.tiering.manager import TieringOffloadingManager
from vllm.v1.metrics.cache_hit_source import CacheHitSource

from kvstore.vllm import LMDBTier

from .helpers import SLOT_BYTES, key, tiering_spec

NUM_PRIMARY_SLOTS = 4
STEP_END = ScheduleEndContext(new_req_ids=(), preempted_req_ids=())


def manager_for(store_path: Path) -> TieringOffloadingManager:
    extra = {
        "spec_name": "TieringOffloadingSpec",
        "cpu_bytes_to_use": NUM_PRIMARY_SLOTS * SLOT_BYTES,
        "secondary_tiers": [
            {
                "type": "LMDBTier",
                "module_path": "kvstore.vllm",
                "path": str(store_path),
                "capacity_bytes": "1MiB",
            }
        ],
    }
    spec = tiering_spec(extra=extra, engine_id=f"lmdb-tier-{uuid.uuid4().hex[:8]}")
    manager = spec.get_manager()
    assert isinstance(manager, TieringOffloadingManager)
    return manager


@pytest.fixture
def manager(tmp_path: Path) -> Iterator[TieringOffloadingManager]:
    manager = manager_for(tmp_path / "store")
    yield manager
    manager.shutdown()


def settle(manager: TieringOffloadingManager, timeout_s: float = 10.0) -> None:
    """Run scheduler steps until no secondary-tier transfer is in flight."""
    deadline = time.monotonic() + timeout_s
    manager.on_schedule_end(STEP_END)
    while manager.has_pending_work():
        assert time.monotonic() < deadline, "tier transfers never finished"
        time.sleep(0.002)
        manager.on_schedule_end(STEP_END)


def offload(
    manager: TieringOffloadingManager, keys: Sequence[OffloadKey], ctx: ReqContext
) -> dict[bytes, bytes]:
    """GPU -> primary (simulated copy), which cascades to the LMDB tier."""
    slots = np.asarray(manager.primary_tier.get_kv_memoryview())
    output = manager.prepare_store(keys, ctx)
    assert output is not None
    values: dict[bytes, bytes] = {}
    for offload_key, slot in zip(output.keys_to_store, output.store_spec.chunk_ids, strict=True):  # type: ignore[attr-defined]
        slots[slot] = np.random.default_rng(len(values) + slot).integers(0, 256, SLOT_BYTES)
        values[offload_key] = slots[slot].tobytes()
    manager.complete_store(output.keys_to_store, ctx)
    settle(manager)
    return values


def test_chunks_evicted_from_cpu_come_back_from_disk(manager: TieringOffloadingManager) -> None:
    tier = manager.secondary_tiers[0]
    assert isinstance(tier, LMDBTier)
    writer = ReqContext(req_id="writer")
    manager.on_new_request(writer)
    keys = [key(i) for i in range(6)]
    values: dict[bytes, bytes] = {}
    for first in range(0, 6, 2):  # 6 chunks through a 4-slot CPU tier
        values |= offload(manager, keys[first : first + 2], writer)
    manager.on_request_finished(writer)
    assert tier.store.stats().namespaces[tier.namespace].num_entries == 6

    reader = ReqContext(req_id="reader")
    manager.on_new_request(reader)
    assert manager.lookup(keys[0], reader) is LookupResult.HIT_PENDING  # promotion started
    settle(manager)
    assert manager.lookup(keys[0], reader) is LookupResult.HIT
    assert manager.get_load_source(keys[0], reader) is CacheHitSource.DISK
    load_spec = manager.prepare_load([keys[0]], reader)
    slot = int(load_spec.chunk_ids[0])  # type: ignore[attr-defined]
    assert np.asarray(manager.primary_tier.get_kv_memoryview())[slot].tobytes() == values[keys[0]]
    manager.complete_load([keys[0]], reader)
    manager.on_request_finished(reader)

    storage = [e for e in manager.take_events() if e.medium is Medium.STORAGE]
    assert sorted(k for e in storage if not e.removed for k in e.keys) == sorted(keys)
    assert not any(e.removed for e in storage)


def test_a_restarted_engine_gets_disk_hits(tmp_path: Path) -> None:
    first = manager_for(tmp_path / "store")
    ctx = ReqContext(req_id="first")
    first.on_new_request(ctx)
    values = offload(first, [key(0), key(1)], ctx)
    first.on_request_finished(ctx)
    first.shutdown()

    second = manager_for(tmp_path / "store")
    try:
        ctx = ReqContext(req_id="second")
        second.on_new_request(ctx)
        assert second.lookup(key(1), ctx) is LookupResult.HIT_PENDING
        settle(second)
        assert second.lookup(key(1), ctx) is LookupResult.HIT
        load_spec = second.prepare_load([key(1)], ctx)
        slot = int(load_spec.chunk_ids[0])  # type: ignore[attr-defined]
        view = np.asarray(second.primary_tier.get_kv_memoryview())
        assert view[slot].tobytes() == values[key(1)]
        second.complete_load([key(1)], ctx)
        second.on_request_finished(ctx)
    finally:
        second.shutdown()
