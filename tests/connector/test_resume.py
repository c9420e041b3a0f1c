"""A request preempted and resumed, as each vLLM release reports it (0.32/0.33: in
`scheduled_cached_reqs.resumed_req_ids`; 0.34: in `scheduled_new_reqs`), through the scheduler
half: store, preemption, resume with a load, and a store from the new block table."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from kvstore.transfer.jobs import CopyJob
from kvstore.vllm.metadata import KVStoreConnectorMetadata, KVStoreWorkerMetadata

from .fakes import BLOCK, Harness, make_harness, new_request
from .vllm_objects import (
    connector_output,
    kv_cache_blocks,
    resumed_in_new_reqs,
    scheduler_output,
)

PROMPT = list(range(100, 111))  # 11 tokens: chunks 0 and 1 are full after the prefill


@pytest.fixture
def harness() -> Iterator[Harness]:
    made = make_harness()
    yield made
    made.close()


def report(h: Harness, *jobs: CopyJob) -> None:
    meta = KVStoreWorkerMetadata({job.job_id: 1 for job in jobs})
    h.scheduler.update_connector_output(connector_output(meta))


def blocks_of(job: CopyJob) -> list[tuple[int, ...]]:
    return [segment.block_ids for segment in job.segments]


def test_a_resumed_request_loads_into_and_stores_from_its_new_blocks(harness: Harness) -> None:
    sched = harness.scheduler
    a, b = new_request("a", PROMPT), new_request("b", [300, 301])  # b: no full chunk
    for request, blocks in ((a, [0, 1, 2]), (b, [10])):
        sched.track(request)
        assert sched.get_num_new_matched_tokens(request, 0) == (0, False)
        sched.update_state_after_alloc(request, kv_cache_blocks(blocks), 0)
    # step 1: both prefill; a's two full chunks are stored from blocks 0 and 1
    meta = sched.build_connector_meta(
        scheduler_output(new={"a": [0, 1, 2], "b": [10]}, num_scheduled_tokens={"a": 11, "b": 2})
    )  # fmt: skip
    (store,) = meta.store_jobs
    assert blocks_of(store) == [(0,), (1,)]
    report(harness, store)
    a.num_computed_tokens, b.num_computed_tokens = 11, 2
    a.append_output_token_ids(7)  # 12 tokens: chunk 2 is full once token 11 is computed
    # step 2: a is preempted (its blocks go back to vLLM's pool), b decodes
    meta = sched.build_connector_meta(
        scheduler_output(cached={"b": None}, num_scheduled_tokens={"b": 1}, preempted={"a"})
    )
    assert meta.store_jobs == [] and meta.flush_job_ids == []
    b.num_computed_tokens = 3
    # step 3: a resumes with a new block table; kvstore serves chunks 0-1 from the CPU tier
    a.num_computed_tokens = 0
    assert sched.get_num_new_matched_tokens(a, 0) == (2 * BLOCK, False)
    sched.update_state_after_alloc(a, kv_cache_blocks([5, 6, 7]), 2 * BLOCK)
    a.num_computed_tokens = 2 * BLOCK
    meta = step_with_resume(harness, a_blocks=[5, 6, 7])
    (load,) = meta.load_jobs
    assert load.is_sync and blocks_of(load) == [(5,), (6,)]
    (store,) = meta.store_jobs  # chunk 2, from the new table: block 7, not the freed block 2
    assert store.req_id == "a" and blocks_of(store) == [(7,)]
    report(harness, load, store)
    harness.index.check_invariants()
    assert harness.index.stats().cpu.num_pinned == 0


def step_with_resume(h: Harness, a_blocks: list[int]) -> KVStoreConnectorMetadata:
    """The step that resumes `a` (and decodes `b`, a running request), sent the way the
    vLLM under test sends it."""
    output = scheduler_output(
        cached={"b": None},
        resumed={"a": a_blocks},
        num_scheduled_tokens={"a": 4, "b": 1},
    )
    names = [data.req_id for data in output.scheduled_new_reqs]
    assert names == (["a"] if resumed_in_new_reqs() else [])
    return h.scheduler.build_connector_meta(output)


def test_a_store_in_flight_at_preemption_is_flushed(harness: Harness) -> None:
    """Its source blocks are about to be reused: the workers finish it before the step."""
    sched = harness.scheduler
    a = new_request("a", PROMPT)
    sched.track(a)
    sched.get_num_new_matched_tokens(a, 0)
    meta = sched.build_connector_meta(
        scheduler_output(new={"a": [0, 1, 2]}, num_scheduled_tokens={"a": 11})
    )
    (store,) = meta.store_jobs
    meta = sched.build_connector_meta(scheduler_output(preempted={"a"}))
    assert meta.flush_job_ids == [store.job_id]
