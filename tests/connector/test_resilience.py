"""KVStoreConnector across restarts, against damaged and full disks, and under load."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import lmdb
import pytest

from kvstore.keys import Tier
from kvstore.tiny_model import TinyLlamaSpec
from kvstore.vllm.engine import engine, generate_runs, kv_transfer_config, scheduler_connector
from tests.support.connector import drain, kvstore_summary
from tests.support.oracle import assert_audited, assert_same_outputs, runs_from
from tests.support.subprocess_run import run_engine_here, run_engine_process
from tiers.lmdb import LMDBStore

pytestmark = pytest.mark.engine

CHUNK_BYTES = TinyLlamaSpec().kv_bytes_per_token * 32  # one 32-token block, every layer
PROMPT = [(13 * i + 5) % 500 + 5 for i in range(200)]
HIT_TOKENS = 192


def _prompts(n: int, shared: int, length: int, seed: int) -> list[list[int]]:
    """`n` prompts sharing their first `shared` tokens, then distinct."""
    base = [(31 * i + seed) % 500 + 5 for i in range(shared)]
    return [
        base + [(17 * i + 97 * j + seed) % 500 + 5 for i in range(length - shared)]
        for j in range(n)
    ]


def _flip_first_value(store_dir: Path) -> None:
    env = lmdb.open(str(store_dir), max_dbs=8, subdir=True)
    try:
        data = env.open_db(b"data")
        with env.begin(write=True, db=data) as txn:
            key, value = next(iter(txn.cursor()))
            damaged = bytearray(value)
            damaged[len(damaged) // 2] ^= 0x40
            txn.put(key, bytes(damaged))
    finally:
        env.close()


def test_restart_serves_from_disk(tiny_model_dir: Path, tmp_path: Path) -> None:
    spec: dict[str, Any] = {
        "model_dir": str(tiny_model_dir),
        "prompts": [PROMPT],
        "extra": {
            "cpu_bytes": 64 * CHUNK_BYTES,
            "disk_path": str(tmp_path / "store"),
            "disk_bytes": 64 * CHUNK_BYTES,
        },
    }
    first = run_engine_here(spec)  # then a restart: a fresh process
    second = run_engine_process(spec)
    assert first["returncode"] == 0 and second["returncode"] == 0, second["stderr_tail"]
    assert first["summary"]["tiers"]["disk"]["stored_chunks"] == 6
    assert second["summary"]["tiers"]["disk"]["hit_tokens"] == HIT_TOKENS, second["summary"]
    assert second["num_cached_tokens"] == [HIT_TOKENS]
    assert_same_outputs(runs_from(first), runs_from(second))
    with LMDBStore.open(tmp_path / "store", readonly=True, create=False) as store:
        (namespace,) = store.namespaces()
        metas = list(store.iter_meta(namespace))
    assert len(metas) == 6
    assert all(m.num_hits == 1 and m.last_access_s > m.created_s for m in metas)


def test_corrupt_chunk_is_recomputed_and_counted(tiny_model_dir: Path, tmp_path: Path) -> None:
    store = tmp_path / "store"
    config = kv_transfer_config(
        cpu_bytes=64 * CHUNK_BYTES, disk_path=str(store), disk_bytes=64 * CHUNK_BYTES
    )
    with engine(tiny_model_dir, kv_transfer=config) as llm:
        _, expected = generate_runs(llm, [PROMPT])
        drain(llm)
    _flip_first_value(store)
    with engine(tiny_model_dir, kv_transfer=config) as llm:
        _, got = generate_runs(llm, [PROMPT])
        drain(llm)
        summary = kvstore_summary(llm)
        index = scheduler_connector(llm).runtime.index
        index.check_invariants()
        assert len(index.ready_keys(Tier.DISK)) == 6  # the bad one was rewritten after recompute
    assert_same_outputs(expected, got)
    assert summary["tiers"]["disk"]["checksum_failures"] == 1, summary
    assert summary["tiers"]["disk"]["hit_tokens"] < HIT_TOKENS


def test_tiny_disk_evicts_and_serves_everything(tiny_model_dir: Path, tmp_path: Path) -> None:
    config = kv_transfer_config(
        cpu_bytes=4 * CHUNK_BYTES,
        disk_path=str(tmp_path / "store"),
        disk_bytes=5 * CHUNK_BYTES,
        audit_loads=True,
    )
    prompts = _prompts(6, 64, 200, seed=3)
    with engine(tiny_model_dir) as llm:
        _, expected = generate_runs(llm, prompts)
    with engine(tiny_model_dir, kv_transfer=config) as llm:
        got = []
        for prompt in prompts:  # the shared prefix comes from kvstore, not the engine's cache
            assert llm.reset_prefix_cache()
            got += generate_runs(llm, [prompt])[1]
            drain(llm)
        summary = kvstore_summary(llm)
        index = scheduler_connector(llm).runtime.index
        index.check_invariants()
        disk = index.stats().disk
    assert_same_outputs(expected, got)
    assert_audited(summary)
    assert disk is not None and disk.used_bytes <= 5 * CHUNK_BYTES
    assert summary["tiers"]["disk"]["evicted_chunks"] > 0, summary


def test_concurrent_requests_leave_no_pins(tiny_model_dir: Path, tmp_path: Path) -> None:
    config = kv_transfer_config(
        cpu_bytes=24 * CHUNK_BYTES,
        disk_path=str(tmp_path / "store"),
        disk_bytes=256 * CHUNK_BYTES,
        audit_loads=True,
    )
    prompts = _prompts(12, 128, 260, seed=1) + _prompts(12, 96, 230, seed=2)
    small = {"kv_cache_bytes": 48 * CHUNK_BYTES, "max_model_len": 512}  # 48 engine blocks: queueing
    with engine(tiny_model_dir, **small) as llm:
        _, expected = generate_runs(llm, prompts)
    with engine(tiny_model_dir, kv_transfer=config, **small) as llm:
        _, first = generate_runs(llm, prompts)
        _, second = generate_runs(llm, list(reversed(prompts)))
        drain(llm)
        connector = scheduler_connector(llm)
        index = connector.runtime.index
        index.check_invariants()
        stats = index.stats()
        summary = kvstore_summary(llm)
        assert stats.cpu.num_pinned == 0 and stats.disk is not None and stats.disk.num_pinned == 0
        assert stats.num_holds == 0
        assert connector.scheduler.num_inflight_jobs == 0
        assert connector.scheduler.num_tracked_requests == 0
    assert_same_outputs(expected, first)
    assert_same_outputs(list(reversed(expected)), second)
    assert_audited(summary)
    hits = summary["tiers"]["cpu"]["hit_tokens"] + summary["tiers"]["disk"]["hit_tokens"]
    assert hits > 0, summary


def test_multiprocess_engine_loads_from_kvstore(tiny_model_dir: Path, tmp_path: Path) -> None:
    """`VLLM_ENABLE_V1_MULTIPROCESSING=1`: the scheduler runs in its own EngineCore process."""
    result = run_engine_process(
        {
            "model_dir": str(tiny_model_dir),
            "prompts": [PROMPT],
            "multiprocess": True,
            "repeat_after_reset": True,
            "extra": {
                "cpu_bytes": 64 * CHUNK_BYTES,
                "disk_path": str(tmp_path / "store"),
                "disk_bytes": 64 * CHUNK_BYTES,
            },
        }
    )
    assert result["returncode"] == 0, result["stderr_tail"]
    assert_same_outputs(runs_from(result), runs_from(result, "repeat_"))
    assert result["repeat_num_cached_tokens"] == [HIT_TOKENS], result["stderr_tail"]


def test_rm_on_a_live_store_is_a_miss_and_shutdown_cleans_up(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """`kvstore rm` from another process while the engine runs: the vanished chunks are misses,
    the engine recomputes; at exit the shared region is gone and the store verifies."""
    store, region_dir = tmp_path / "store", tmp_path / "shm"
    config = kv_transfer_config(
        cpu_bytes=8 * CHUNK_BYTES,
        disk_path=str(store),
        disk_bytes=64 * CHUNK_BYTES,
        region_dir=str(region_dir),
    )
    other = [(19 * i + 2) % 500 + 5 for i in range(200)]
    cli = [sys.executable, "-c", "from kvstore.cli import main; main()"]
    with engine(tiny_model_dir, kv_transfer=config) as llm:
        _, expected = generate_runs(llm, [PROMPT])
        drain(llm)
        generate_runs(llm, [other])  # pushes most of PROMPT's chunks out of the CPU tier
        drain(llm)
        assert len(list(region_dir.iterdir())) == 1
        removed = subprocess.run([*cli, "rm", str(store), "--all", "--yes"], check=False)
        assert removed.returncode == 0
        assert llm.reset_prefix_cache()
        _, got = generate_runs(llm, [PROMPT])
        drain(llm)
        summary = kvstore_summary(llm)
        scheduler_connector(llm).runtime.index.check_invariants()
    assert_same_outputs(expected, got)
    assert summary["tiers"]["disk"]["hit_tokens"] == 0, summary
    assert list(region_dir.iterdir()) == []  # the region was removed at shutdown
    verified = subprocess.run(
        [*cli, "verify", str(store), "--json"], capture_output=True, check=False
    )
    assert verified.returncode == 0, verified.stderr


def test_tensor_parallel_2_rows_hold_both_ranks(tiny_model_dir: Path, tmp_path: Path) -> None:
    """TP=2 on the CPU platform (two worker processes, one core each): each rank writes its
    slice of a chunk into the shared row; the prefix comes back from kvstore for both ranks."""
    result = run_engine_process(
        {
            "model_dir": str(tiny_model_dir),
            "prompts": [PROMPT],
            "multiprocess": True,
            "repeat_after_reset": True,
            "llm_kwargs": {"tensor_parallel_size": 2},
            "env": {"VLLM_CPU_OMP_THREADS_BIND": "0|1"},
            "extra": {
                "cpu_bytes": 64 * CHUNK_BYTES,
                "disk_path": str(tmp_path / "store"),
                "disk_bytes": 64 * CHUNK_BYTES,
            },
        },
        timeout_s=500,
    )
    assert result["returncode"] == 0, result["stderr_tail"]
    assert_same_outputs(runs_from(result), runs_from(result, "repeat_"))
    assert result["repeat_num_cached_tokens"] == [HIT_TOKENS], result["stderr_tail"]
    with LMDBStore.open(tmp_path / "store", readonly=True, create=False) as store:
        ((namespace, descriptor),) = store.namespaces().items()
        sizes = {m.size_bytes for m in store.iter_meta(namespace)}
    assert descriptor["tp_size"] == 2
    assert sizes == {CHUNK_BYTES}  # two half-size rank slices per row


def test_damaged_store_file_degrades_to_the_cpu_tier(tiny_model_dir: Path, tmp_path: Path) -> None:
    store = tmp_path / "store"
    store.mkdir()
    (store / "data.mdb").write_bytes(b"\xff" * 16384)  # not an LMDB file any more
    config = kv_transfer_config(
        cpu_bytes=64 * CHUNK_BYTES, disk_path=str(store), disk_bytes=64 * CHUNK_BYTES
    )
    with engine(tiny_model_dir, kv_transfer=config) as llm:
        _, first = generate_runs(llm, [PROMPT])
        drain(llm)
        assert llm.reset_prefix_cache()
        _, again = generate_runs(llm, [PROMPT])
        summary = kvstore_summary(llm)
        registry = scheduler_connector(llm).runtime.registry
        open_errors = registry.get_sample_value("kvstore_io_errors_total", {"op": "open"})
    assert_same_outputs(first, again)
    assert summary["tiers"]["cpu"]["hit_tokens"] == HIT_TOKENS
    assert summary["tiers"]["disk"]["stored_chunks"] == 0
    assert open_errors == 1
    assert (store / "data.mdb").read_bytes() == b"\xff" * 16384  # left as it was, for inspection


def test_disk_path_that_is_a_file_fails_at_start_naming_the_key(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("x")
    config = kv_transfer_config(
        cpu_bytes=64 * CHUNK_BYTES, disk_path=str(not_a_dir), disk_bytes=1 << 20
    )
    with (
        pytest.raises(Exception, match="disk_path") as caught,
        engine(tiny_model_dir, kv_transfer=config),
    ):
        pass
    assert "not a directory" in str(caught.value) or "directory" in str(caught.value)
