"""KVStoreConnector under vLLM's own `Scheduler` (the release under test): stores, hits,
preemption and resume, with every context position checked against what computing it writes
(`vllm_loop`). Runs on vLLM 0.32 here and on 0.33/0.34 in `make test-vllm-versions`."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kvstore.vllm.compat import resumed_req_ids
from kvstore.vllm.request_table import RequestTable
from kvstore.vllm.worker import ConnectorWorker

from .vllm_loop import BLOCK, Loop, kv_cache_config, make_loop, vllm_config
from .vllm_objects import resumed_in_new_reqs


@pytest.fixture(params=[False, True], ids=["save-first", "results-first"])
def loop(
    request: pytest.FixtureRequest,
    tiny_model_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[Loop]:
    """Both orders of `wait_for_save` and `get_finished` that vLLM's model runners use."""
    made = make_loop(tiny_model_dir, tmp_path, monkeypatch, defer_finalize=request.param)
    yield made
    made.close()


def prompt(seed: int, num_tokens: int) -> list[int]:
    return [(seed * 7919 + i * 31) % 400 + 1 for i in range(num_tokens)]


def test_a_stored_prefix_is_loaded_when_vllm_has_evicted_it(loop: Loop) -> None:
    tokens = prompt(1, 3 * BLOCK + 5)
    loop.add("a", tokens, max_tokens=4)
    loop.run()
    assert loop.hit_tokens() == 0
    assert loop.scheduler.reset_prefix_cache()  # vLLM forgets; kvstore still has the chunks
    loop.add("b", tokens, max_tokens=4)
    loop.run()
    assert loop.hit_tokens() == 3 * BLOCK
    assert loop.num_bad_positions == 0
    assert loop.connector.scheduler.num_tracked_requests == 0  # every store was reported


def test_a_request_that_finishes_waits_for_its_stores(loop: Loop) -> None:
    """The last step's chunks are still being copied when the request finishes: vLLM keeps
    its blocks until the worker reports the stores (`finished_sending`)."""
    first = loop.add("a", prompt(4, 2 * BLOCK - 1), max_tokens=2)  # its last step fills chunk 1
    loop.run()
    assert loop.connector.scheduler.num_tracked_requests == 0
    assert loop.scheduler.reset_prefix_cache()
    loop.add("b", [*first.all_token_ids, 1], max_tokens=1)
    loop.run()
    assert loop.hit_tokens() == 2 * BLOCK
    assert loop.num_bad_positions == 0


def run_with_preemption(loop: Loop) -> list[int]:
    """Two requests outgrow 6 usable blocks: when "a" needs its 4th block, vLLM preempts "b"
    halfway through its 3rd (the chunk completes after the resume), and resumes it once "a"
    has finished. Then b's whole sequence comes back with vLLM's prefix cache empty: kvstore
    serves every full chunk, those stored after the resume included. Returns that sequence."""
    first = loop.add("a", prompt(2, 40), max_tokens=40)
    second = loop.add("b", prompt(3, 28), max_tokens=40)
    loop.run()
    assert loop.num_preemptions >= 1
    assert second.num_preemptions >= 1 and first.num_preemptions == 0
    token_ids = list(second.all_token_ids)
    assert loop.scheduler.reset_prefix_cache()
    loop.add("again", token_ids, max_tokens=1)
    loop.run()
    return token_ids


def test_a_preempted_request_resumes_and_what_kvstore_stored_is_right(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    loop = make_loop(tiny_model_dir, tmp_path, monkeypatch, num_blocks=7)
    try:
        token_ids = run_with_preemption(loop)
        # 0.34 resends the resumed request in scheduled_new_reqs; 0.32/0.33 never do
        assert (loop.num_resumed_as_new > 0) == resumed_in_new_reqs()
        assert loop.hit_tokens() >= (len(token_ids) - 1) // BLOCK * BLOCK
        assert loop.num_bad_positions == 0
    finally:
        loop.close()


def test_the_check_catches_a_resume_that_extends_the_old_block_table(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Planted fault: the scheduler half appends a resumed request's new block table to the
    old one instead of replacing it (what ignoring `resumed_req_ids` does on 0.32/0.33)."""
    follow = RequestTable.follow_block_ids

    def append_on_resume(self: RequestTable, output: Any) -> None:
        old = {state.req_id: [list(ids) for ids in state.block_ids] for state in self}
        follow(self, output)
        resumed = {data.req_id for data in output.scheduled_new_reqs}
        resumed |= set(resumed_req_ids(output.scheduled_cached_reqs))
        for req_id in resumed & set(old):
            state = self.get(req_id)
            if old[req_id] and state is not None:
                new = state.block_ids or [[] for _ in old[req_id]]
                state.block_ids = [o + n for o, n in zip(old[req_id], new, strict=True)]

    monkeypatch.setattr(RequestTable, "follow_block_ids", append_on_resume)
    loop = make_loop(tiny_model_dir, tmp_path, monkeypatch, num_blocks=7)
    try:
        run_with_preemption(loop)
        assert loop.num_bad_positions > 0
    finally:
        loop.close()


def take_kv_memory_away(loop: Loop) -> None:
    """What vLLM >= 0.33 does around its KV memory (sleep; on 0.34 also
    `release_kv_cache_memory` and weight updates borrowing it): pause with the cache cleared
    (running requests preempted), `unregister_kv_caches`, free the memory, map fresh zeroed
    memory, `restore_kv_caches`."""
    assert loop.scheduler.reset_prefix_cache(reset_running_requests=True)
    loop.worker.unregister_kv_caches()
    for tensor in loop.kv.values():
        tensor.fill_(float("nan"))  # freed
    for tensor in loop.kv.values():
        tensor.zero_()  # re-mapped
    loop.worker.restore_kv_caches()


def run_across_kv_memory_loss(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Loop:
    """A prefill's store job is still queued (one chunk per step) when the KV memory goes
    away; the request then runs to the end, and its whole sequence comes back after vLLM's
    prefix cache is cleared."""
    loop = make_loop(
        tiny_model_dir, tmp_path, monkeypatch, step_copy_budget_bytes=2 * BLOCK * 1024
    )  # one chunk: 2 layers x 2 KV heads x BLOCK tokens x 2 x 32 floats = 16 KiB
    first = loop.add("a", prompt(5, 5 * BLOCK + 3), max_tokens=3)
    loop.step()
    take_kv_memory_away(loop)
    loop.run()
    assert loop.scheduler.reset_prefix_cache()
    loop.add("again", list(first.all_token_ids), max_tokens=1)
    loop.run()
    return loop


def test_stores_queued_when_the_kv_memory_goes_away_fail_and_nothing_wrong_is_served(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    loop = run_across_kv_memory_loss(tiny_model_dir, tmp_path, monkeypatch)
    try:
        assert loop.num_bad_positions == 0
        registry = loop.connector.runtime.registry
        labels = {"direction": "engine_to_cpu", "result": "error"}
        assert registry.get_sample_value("kvstore_transfers_total", labels) == 1
        index = loop.connector.runtime.index
        index.check_invariants()
        assert index.stats().cpu.num_pinned == 0
    finally:
        loop.close()


def test_the_check_catches_stores_that_copy_after_unregister(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Planted fault: the worker ignores unregister/restore (vLLM's no-op defaults, what
    kvstore did before): its queued store copies the re-mapped, zeroed blocks."""
    monkeypatch.setattr(ConnectorWorker, "unregister_kv_caches", lambda self: None)
    monkeypatch.setattr(ConnectorWorker, "restore_kv_caches", lambda self: None)
    loop = run_across_kv_memory_loss(tiny_model_dir, tmp_path, monkeypatch)
    try:
        assert loop.num_bad_positions > 0
    finally:
        loop.close()


def test_sleep_mode_is_refused(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """vLLM >= 0.33 asks the connector (`supports_sleep_mode(kv_transfer_config)`) and refuses
    with its own message; 0.32 does not ask, and the connector refuses when it is built."""
    from vllm.distributed.kv_transfer.kv_connector.v1.base import (
        KVConnectorBase_V1,
        KVConnectorRole,
    )
    from vllm.platforms import current_platform

    from kvstore.errors import ConfigError
    from kvstore.vllm import KVStoreConnector

    assert KVStoreConnector.supports_sleep_mode() is False
    monkeypatch.setattr(type(current_platform), "is_sleep_mode_available", lambda self: True)
    sleepy = {"model_options": {"enable_sleep_mode": True}}
    if hasattr(KVConnectorBase_V1, "supports_sleep_mode"):
        with pytest.raises(ValueError, match="KVStoreConnector does not support sleep mode"):
            vllm_config(tiny_model_dir, tmp_path, monkeypatch, **sleepy)
        config = vllm_config(tiny_model_dir, tmp_path, monkeypatch)
        assert KVStoreConnector.supports_sleep_mode(config.kv_transfer_config) is False
    else:
        config = vllm_config(tiny_model_dir, tmp_path, monkeypatch, **sleepy)
        with pytest.raises(ConfigError, match="KVStoreConnector does not support sleep mode"):
            KVStoreConnector(config, KVConnectorRole.SCHEDULER, kv_cache_config(8))
