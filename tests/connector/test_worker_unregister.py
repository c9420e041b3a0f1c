"""The worker half around `unregister_kv_caches` / `restore_kv_caches` (vLLM >= 0.33 freeing or
re-mapping the KV memory: sleep, and on 0.34 its extensible KV cache releasing memory).

After unregister no copy touches the KV tensors (vLLM is about to free them: here they are
filled with a sentinel and must keep it), every job without a result fails (stores: the
scheduler releases their rows; loads: their blocks are load errors, so vLLM recomputes), jobs
that arrive meanwhile fail too, and after restore the same tensors are copied again."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from kvstore.config import KVStoreConfig
from kvstore.transfer.jobs import ChunkSegment, CopyJob, JobKind
from kvstore.vllm.geometry import EngineGeometry
from kvstore.vllm.metadata import KVStoreConnectorMetadata
from kvstore.vllm.worker import ConnectorWorker
from tiers.cpu import CPURegion

NUM_BLOCKS, BLOCK, WIDTH = 16, 4, 8  # float32 [blocks, block tokens, width] per layer
LAYERS = ("layer.0", "layer.1")
BLOCK_BYTES = BLOCK * WIDTH * 4
SENTINEL = -7.0  # what "freed" KV memory holds in these tests

GEOMETRY = EngineGeometry(
    engine_id="unregister-test",
    model="fake",
    kv_dtype="float32",
    engine_block_size=BLOCK,
    hash_block_size=BLOCK,
    blocks_per_chunk=1,
    tp_size=1,
    num_engine_blocks=NUM_BLOCKS,
    layer_names=LAYERS,
    layer_block_bytes=(BLOCK_BYTES, BLOCK_BYTES),
    device_type="cpu-test",
    attention_backend="test",
    kv_cache_layout="default",
    hash_algo="sha256",
    is_hash_stable=True,
)


class Setup:
    def __init__(self, tmp_path: Path) -> None:
        self.region = CPURegion.create(
            GEOMETRY.region_name, 8, GEOMETRY.row_bytes, directory=tmp_path
        )
        config = KVStoreConfig.from_extra_config(
            {"region_dir": str(tmp_path), "step_copy_budget_bytes": GEOMETRY.slice_bytes}
        )  # one chunk per step: multi-chunk jobs stay queued
        self.kv = {
            name: torch.arange(NUM_BLOCKS * BLOCK * WIDTH, dtype=torch.float32).reshape(
                NUM_BLOCKS, BLOCK, WIDTH
            ) + 1000.0 * i
            for i, name in enumerate(LAYERS)
        }  # fmt: skip
        self.worker = ConnectorWorker(GEOMETRY, config, tp_rank=0)
        self.worker.register_kv_caches(self.kv)

    def rows(self) -> list[bytes]:
        return [bytes(self.region.row(i)) for i in range(8)]

    def close(self) -> None:
        self.worker.shutdown()
        self.region.close()


@pytest.fixture
def setup(tmp_path: Path) -> Iterator[Setup]:
    made = Setup(tmp_path)
    yield made
    made.close()


def job(
    job_id: int, kind: JobKind, req_id: str, chunks: dict[int, int], *, sync: bool = False
) -> CopyJob:
    """`chunks`: row -> engine block (one block per chunk)."""
    segments = tuple(ChunkSegment(row, 0, (block,), b"k%d" % row) for row, block in chunks.items())
    return CopyJob(job_id, kind, req_id, segments, is_sync=sync)


def run_step(worker: ConnectorWorker, meta: KVStoreConnectorMetadata) -> tuple[set[str], set[int]]:
    """One step's worker calls; returns (finished receiving, load errors)."""
    worker.handle_preemptions(meta)
    worker.start_load_kv(meta)
    worker.wait_for_save(meta)
    _, finished_recving = worker.get_finished(set())
    return finished_recving, worker.get_block_ids_with_load_errors()


def test_unregister_fails_unfinished_jobs_and_no_copy_touches_the_caches(setup: Setup) -> None:
    worker = setup.worker
    store = job(1, JobKind.STORE, "s", {0: 1, 1: 2, 2: 3})
    load = job(2, JobKind.LOAD, "l", {5: 8, 6: 9, 7: 10})  # asynchronous: queued
    run_step(worker, KVStoreConnectorMetadata(load_jobs=[load], store_jobs=[store]))
    first = worker.build_connector_worker_meta()  # both under way, one chunk each
    assert first is not None and (first.completed, first.failed) == ({}, {})
    worker.unregister_kv_caches()
    worker.unregister_kv_caches()  # idempotent
    for tensor in setup.kv.values():
        tensor.fill_(SENTINEL)  # vLLM frees the memory
    rows = setup.rows()
    late_store = job(3, JobKind.STORE, "s2", {3: 4})
    late_load = job(4, JobKind.LOAD, "l2", {0: 11}, sync=True)
    finished, errors = run_step(
        worker, KVStoreConnectorMetadata(load_jobs=[late_load], store_jobs=[late_store])
    )
    assert finished == {"l"}  # an asynchronous load ends (failed), so vLLM stops waiting
    assert errors == {8, 9, 10, 11}  # recomputed by vLLM
    meta = worker.build_connector_worker_meta()
    assert meta is not None
    assert meta.completed == {} and meta.failed == {1: 1, 2: 1, 3: 1, 4: 1}
    assert {d: s["num_failed"] for d, s in meta.transfer_stats[0].items()} == {
        "engine_to_cpu": 2, "cpu_to_engine": 2,
    }  # fmt: skip
    assert setup.rows() == rows  # no store copied a byte
    assert all(bool((t == SENTINEL).all()) for t in setup.kv.values())  # no load wrote one


def test_restore_copies_again(setup: Setup) -> None:
    worker = setup.worker
    worker.unregister_kv_caches()
    worker.restore_kv_caches()
    worker.restore_kv_caches()  # idempotent
    layers = list(setup.kv.values())
    original = [t[2].clone() for t in layers]
    run_step(worker, KVStoreConnectorMetadata(store_jobs=[job(1, JobKind.STORE, "s", {0: 2})]))
    sync_load = job(2, JobKind.LOAD, "l", {0: 12}, sync=True)
    finished, errors = run_step(worker, KVStoreConnectorMetadata(load_jobs=[sync_load]))
    assert (finished, errors) == (set(), set())
    assert all(torch.equal(t[12], o) for t, o in zip(layers, original, strict=True))
    meta = worker.build_connector_worker_meta()
    assert meta is not None and meta.completed == {1: 1, 2: 1} and meta.failed == {}


def test_results_finished_before_unregister_stay_successes(setup: Setup) -> None:
    worker = setup.worker
    run_step(worker, KVStoreConnectorMetadata(store_jobs=[job(1, JobKind.STORE, "s", {0: 1})]))
    worker.unregister_kv_caches()
    worker.get_finished(set())
    meta = worker.build_connector_worker_meta()
    assert meta is not None and meta.completed == {1: 1} and meta.failed == {}
