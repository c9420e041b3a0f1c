"""Fakes of what vLLM hands the connector (Request, SchedulerOutput, ...), for fast tests of
the scheduler half with a real index, tier service and metrics (no engine)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

from kvstore.index import IndexConfig, TierIndex
from kvstore.metrics import KVStoreMetrics
from kvstore.pipeline import TierPipeline
from kvstore.service import TierService
from kvstore.service.disk_io import DiskIO
from kvstore.vllm.geometry import EngineGeometry
from kvstore.vllm.scheduler import ConnectorScheduler
from tiers.memory import MemoryStore

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


@dataclass
class FakeRequest:
    """vLLM's Request as the connector reads it: ids, hashes of full blocks, tokens."""

    request_id: str
    all_token_ids: list[int]
    num_computed_tokens: int = 0

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)

    @property
    def block_hashes(self) -> list[bytes]:
        n = len(self.all_token_ids) // BLOCK
        return [_prefix_hash(self.all_token_ids[: (i + 1) * BLOCK]) for i in range(n)]


def _prefix_hash(tokens: list[int]) -> bytes:
    return bytes(hash(tuple(tokens)).to_bytes(8, "big", signed=True)) * 4


@dataclass
class FakeBlocks:
    block_ids: list[int]

    def get_block_ids(self) -> tuple[list[int]]:
        return (self.block_ids,)


@dataclass
class NewReq:
    req_id: str
    block_ids: tuple[list[int]]


@dataclass
class CachedReqs:
    req_ids: list[str] = field(default_factory=list)
    new_block_ids: list[Any] = field(default_factory=list)
    resumed_req_ids: set[str] = field(default_factory=set)


@dataclass
class FakeSchedulerOutput:
    scheduled_new_reqs: list[NewReq] = field(default_factory=list)
    scheduled_cached_reqs: CachedReqs = field(default_factory=CachedReqs)
    num_scheduled_tokens: dict[str, int] = field(default_factory=dict)
    preempted_req_ids: set[str] = field(default_factory=set)


@dataclass
class FakeConnectorOutput:
    kv_connector_worker_meta: Any = None
    finished_sending: set[str] = field(default_factory=set)
    finished_recving: set[str] = field(default_factory=set)


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


def make_harness(
    num_cpu_rows: int = 8, *, disk_chunks: int = 0, sync_budget_chunks: int = 100,
    tmp: Path | None = None,
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
        store = MemoryStore(disk_chunks * SLICE_BYTES * 2)
        store.register_namespace("ns", {"row_bytes": SLICE_BYTES})
        disk = DiskIO(store, "ns", Rows(num_cpu_rows))
    service = TierService(disk=disk, metrics=metrics)
    service.start()
    pipeline = TierPipeline(index, service, [metrics], num_tokens_per_chunk=BLOCK)
    scheduler = ConnectorScheduler(
        GEOMETRY,
        pipeline,
        metrics,
        num_workers=1,
        sync_load_budget_bytes=sync_budget_chunks * SLICE_BYTES,
    )
    return Harness(scheduler, index, service, metrics, store)
