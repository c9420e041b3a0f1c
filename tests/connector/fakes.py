"""A harness for fast tests of the scheduler half: a real index, tier service and metrics (no
engine), driven with vLLM's own objects (`vllm_objects`: built from the classes of the vLLM
release under test)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from prometheus_client import CollectorRegistry
from vllm.v1.request import Request

from kvstore.index import IndexConfig, TierIndex
from kvstore.metrics import KVStoreMetrics
from kvstore.pipeline import TierPipeline
from kvstore.service import TierService
from kvstore.service.disk_io import DiskIO
from kvstore.vllm.geometry import EngineGeometry
from kvstore.vllm.scheduler import ConnectorScheduler
from tiers.errors import CorruptionError
from tiers.memory import MemoryStore

from .vllm_objects import make_request

BLOCK = 4  # tokens per engine block = per chunk
SLICE_BYTES = 64

GEOMETRY = EngineGeometry(
    engine_id="test",
    model="fake",
    kv_dtype="float32",
    engine_block_size=BLOCK,
    hash_block_size=BLOCK,
    blocks_per_chunk=1,
    tp_size=1,
    num_engine_blocks=64,
    layer_names=("layer.0",),
    layer_block_bytes=(SLICE_BYTES,),
    device_type="cpu-test",
    attention_backend="test",
    kv_cache_layout="default",
    hash_algo="sha256",
    is_hash_stable=True,
)


def new_request(req_id: str, token_ids: list[int]) -> Request:
    """A real vLLM request of `token_ids`, its block hashes vLLM's own (one per `BLOCK`)."""
    return make_request(req_id, token_ids, block_size=BLOCK)


@dataclass
class Harness:
    scheduler: ConnectorScheduler
    index: TierIndex
    service: TierService
    metrics: KVStoreMetrics
    store: MemoryStore | None

    def close(self) -> None:
        self.service.close()


class Rows:
    def __init__(self, num_rows: int) -> None:
        self._rows = [bytearray(SLICE_BYTES) for _ in range(num_rows)]

    def row(self, index: int) -> memoryview:
        return memoryview(self._rows[index])


class SlowReads(MemoryStore):
    """A memory store whose reads take `delay_s` longer."""

    def __init__(self, capacity_bytes: int, *, delay_s: float = 0.0) -> None:
        super().__init__(capacity_bytes)
        self.delay_s = delay_s

    def get_many_into(
        self, namespace: str, items: Sequence[tuple[bytes, memoryview]]
    ) -> list[int | CorruptionError | None]:
        time.sleep(self.delay_s)
        return super().get_many_into(namespace, items)


def make_harness(
    num_cpu_rows: int = 8, *, disk_chunks: int = 0, sync_budget_chunks: int = 100,
    tmp: Path | None = None, promotion_wait_s: float = 0.0, read_delay_s: float = 0.0,
) -> Harness:  # fmt: skip
    index = TierIndex(
        IndexConfig(
            num_cpu_rows=num_cpu_rows,
            chunk_bytes=SLICE_BYTES,
            num_tokens_per_chunk=BLOCK,
            disk_capacity_bytes=disk_chunks * SLICE_BYTES,
        )
    )
    metrics = KVStoreMetrics(CollectorRegistry())
    store = None
    disk = None
    if disk_chunks:
        store = SlowReads(disk_chunks * SLICE_BYTES * 2, delay_s=read_delay_s)
        store.register_namespace("ns", {"row_bytes": SLICE_BYTES})
        disk = DiskIO(store, "ns", Rows(num_cpu_rows))
    service = TierService(disk=disk, metrics=metrics)
    service.start()
    pipeline = TierPipeline(
        index, service, [metrics], num_tokens_per_chunk=BLOCK, promotion_wait_s=promotion_wait_s
    )
    scheduler = ConnectorScheduler(
        GEOMETRY,
        pipeline,
        metrics,
        num_workers=1,
        sync_load_budget_bytes=sync_budget_chunks * SLICE_BYTES,
    )
    return Harness(scheduler, index, service, metrics, store)
