"""The scheduler half of KVStoreConnector with vLLM's own objects (no engine, fast).

Drives `ConnectorScheduler` the way vLLM's scheduler does (lookup, allocation, per-step
metadata, worker results, request end) over a real index, tier service and metrics.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from vllm.v1.metrics.cache_hit_source import CacheHitSource
from vllm.v1.request import Request

from kvstore.keys import Tier
from kvstore.pipeline.waits import ALONE_WAIT_MAX_S
from kvstore.transfer.jobs import JobKind
from kvstore.vllm.metadata import KVStoreConnectorMetadata, KVStoreWorkerMetadata

from .fakes import BLOCK, Harness, make_harness, new_request
from .vllm_objects import connector_output, kv_cache_blocks, scheduler_output

PROMPT = list(range(100, 111))  # 11 tokens: 2 full chunks can be stored, the last token computed


@pytest.fixture
def harness() -> Iterator[Harness]:
    made = make_harness()
    yield made
    made.close()


def step(h: Harness, request: Request, block_ids: list[int]) -> KVStoreConnectorMetadata:
    """vLLM schedules all of `request`'s remaining tokens in one step."""
    output = scheduler_output(
        new={request.request_id: block_ids},
        num_scheduled_tokens={request.request_id: request.num_tokens - request.num_computed_tokens},
    )
    return h.scheduler.build_connector_meta(output)


def report(
    h: Harness, *job_ids: int, failed: bool = False, finished: frozenset[str] = frozenset()
) -> None:
    counts = {job_id: 1 for job_id in job_ids}
    meta = KVStoreWorkerMetadata(failed=counts) if failed else KVStoreWorkerMetadata(counts)
    h.scheduler.update_connector_output(connector_output(meta, finished_sending=set(finished)))


def store_prompt(h: Harness, request: Request, block_ids: list[int]) -> None:
    h.scheduler.track(request)
    assert h.scheduler.get_num_new_matched_tokens(request, 0) == (0, False)
    h.scheduler.update_state_after_alloc(request, kv_cache_blocks(block_ids), 0)
    meta = step(h, request, block_ids)
    (job,) = meta.store_jobs
    assert job.kind is JobKind.STORE
    assert [s.block_ids for s in job.segments] == [(b,) for b in block_ids[:2]]
    assert h.scheduler.has_pending_work()  # the job is on the workers
    report(h, job.job_id)
    assert not h.scheduler.has_pending_work()
    request.num_computed_tokens = request.num_tokens


def test_stores_full_chunks_then_serves_them_synchronously(harness: Harness) -> None:
    first = new_request("a", PROMPT)
    store_prompt(harness, first, [0, 1, 2])
    assert len(harness.index.ready_keys(Tier.CPU)) == 2
    assert harness.scheduler.request_finished(first) == (False, None)

    again = new_request("b", PROMPT)
    harness.scheduler.track(again)
    hit = harness.scheduler.get_num_new_matched_tokens(again, 0)
    assert hit == (2 * BLOCK, False)  # a CPU hit in budget: loaded before this step's forward
    harness.scheduler.update_state_after_alloc(again, kv_cache_blocks([7, 8, 9]), 2 * BLOCK)
    meta = step(harness, again, [7, 8, 9])
    (load,) = meta.load_jobs
    assert load.is_sync and [s.block_ids for s in load.segments] == [(7,), (8,)]
    assert all(s.row >= 0 and s.key for s in load.segments)
    assert harness.scheduler.hit_sources(again, 2 * BLOCK) == {CacheHitSource.HOST: 2 * BLOCK}
    assert harness.index.stats().cpu.num_pinned == 2  # pinned until the workers report
    report(harness, load.job_id)
    assert harness.index.stats().cpu.num_pinned == 0
    harness.index.check_invariants()


def test_a_hit_over_the_step_budget_loads_asynchronously() -> None:
    h = make_harness(sync_budget_chunks=1)
    try:
        store_prompt(h, new_request("a", PROMPT), [0, 1, 2])
        again = new_request("b", PROMPT)
        assert h.scheduler.get_num_new_matched_tokens(again, 0) == (2 * BLOCK, True)
        h.scheduler.update_state_after_alloc(again, kv_cache_blocks([7, 8, 9]), 2 * BLOCK)
        (load,) = step(h, again, [7, 8, 9]).load_jobs
        assert not load.is_sync
    finally:
        h.close()


def test_a_failed_load_is_counted_and_unpins(harness: Harness) -> None:
    store_prompt(harness, new_request("a", PROMPT), [0, 1, 2])
    again = new_request("b", PROMPT)
    harness.scheduler.get_num_new_matched_tokens(again, 0)
    harness.scheduler.update_state_after_alloc(again, kv_cache_blocks([7, 8, 9]), 2 * BLOCK)
    (load,) = step(harness, again, [7, 8, 9]).load_jobs
    report(harness, load.job_id, failed=True)
    registry = harness.metrics.registry
    assert registry.get_sample_value("kvstore_load_failed_chunks_total") == 2
    assert harness.index.stats().cpu.num_pinned == 0


def test_a_finished_request_waits_for_its_stores(harness: Harness) -> None:
    request = new_request("a", PROMPT)
    harness.scheduler.track(request)
    harness.scheduler.get_num_new_matched_tokens(request, 0)
    (job,) = step(harness, request, [0, 1, 2]).store_jobs
    assert harness.scheduler.request_finished(request) == (True, None)
    meta = harness.scheduler.build_connector_meta(scheduler_output())
    assert meta.finished_store_reqs == ["a"]  # the workers report it once its stores are done
    report(harness, job.job_id, finished=frozenset({"a"}))
    assert harness.scheduler.num_tracked_requests == 0
    assert len(harness.index.ready_keys(Tier.CPU)) == 2


@pytest.mark.parametrize(
    ("promotion_wait_s", "read_delay_s", "is_answered_at_once"),
    [(0.0, 0.0, False), (5.0, 0.0, True), (0.05, 0.3, False)],
    ids=["no-wait", "fast-read-within-the-wait", "slow-read-past-the-wait"],
)
def test_disk_hits_are_promoted_before_they_load(
    promotion_wait_s: float, read_delay_s: float, is_answered_at_once: bool
) -> None:
    """The first lookup of a disk-only prefix answers the hit at once when the read lands
    within the promotion wait (no extra scheduler step), else "pending" until it lands."""
    h = make_harness(
        num_cpu_rows=2, disk_chunks=8, promotion_wait_s=promotion_wait_s,
        read_delay_s=read_delay_s,
    )  # fmt: skip
    try:
        store_prompt(h, new_request("a", PROMPT), [0, 1, 2])
        wait_until(lambda: h.scheduler.settle() or len(h.index.ready_keys(Tier.DISK)) == 2)
        other = new_request("o", list(range(200, 211)))
        store_prompt(h, other, [3, 4, 5])  # evicts PROMPT's chunks from the 2 CPU rows
        wait_until(lambda: h.scheduler.settle() or len(h.index.ready_keys(Tier.DISK)) == 4)
        again = new_request("b", PROMPT)
        start_s = time.monotonic()
        first = h.scheduler.get_num_new_matched_tokens(again, 0)
        waited_s = time.monotonic() - start_s
        assert first == ((2 * BLOCK, False) if is_answered_at_once else (None, False))
        assert waited_s < max(promotion_wait_s, 0.01) + 0.25  # never past the wait
        deadline = time.monotonic() + 5
        hit = first
        while hit[0] is None:
            assert time.monotonic() < deadline
            time.sleep(0.01)
            hit = h.scheduler.get_num_new_matched_tokens(again, 0)
        assert hit == (2 * BLOCK, False)
        h.scheduler.update_state_after_alloc(again, kv_cache_blocks([7, 8, 9]), 2 * BLOCK)
        (load,) = step(h, again, [7, 8, 9]).load_jobs
        assert h.scheduler.hit_sources(again, 2 * BLOCK) == {CacheHitSource.DISK: 2 * BLOCK}
        report(h, load.job_id)
        h.index.check_invariants()
        registry = h.metrics.registry
        disk_hits = registry.get_sample_value("kvstore_hit_tokens_total", {"tier": "disk"})
        assert disk_hits == 2 * BLOCK
    finally:
        h.close()


@pytest.mark.parametrize(
    ("is_alone", "promotion_wait_s"),
    [(True, 0.02), (False, 0.02), (True, 0.0)],
    ids=["alone", "beside-another-request", "alone-but-no-wait-configured"],
)
def test_the_only_request_in_the_engine_waits_in_its_lookup_for_a_slow_promotion(
    is_alone: bool, promotion_wait_s: float
) -> None:
    """A read slower than the promotion wait: beside another live request the lookup answers
    "pending" at once (that request's steps go on); the only request in the engine waits for
    the read in its lookup (no idle steps beside it) and gets its hit in one call, unless the
    operator set `promotion_wait_ms: 0` (no lookup ever blocks)."""
    h = make_harness(
        num_cpu_rows=2, disk_chunks=8, promotion_wait_s=promotion_wait_s, read_delay_s=0.15
    )
    try:
        first, other = new_request("a", PROMPT), new_request("o", list(range(200, 211)))
        store_prompt(h, first, [0, 1, 2])
        wait_until(lambda: h.scheduler.settle() or len(h.index.ready_keys(Tier.DISK)) == 2)
        store_prompt(h, other, [3, 4, 5])  # evicts PROMPT's chunks from the 2 CPU rows
        wait_until(lambda: h.scheduler.settle() or len(h.index.ready_keys(Tier.DISK)) == 4)
        h.scheduler.request_finished(first)
        if is_alone:
            h.scheduler.request_finished(other)
        again = new_request("b", PROMPT)
        h.scheduler.track(again)
        start_s = time.monotonic()
        answer = h.scheduler.get_num_new_matched_tokens(again, 0)
        waited_s = time.monotonic() - start_s
        if is_alone and promotion_wait_s > 0:
            assert answer == (2 * BLOCK, False)
            assert 0.1 < waited_s < ALONE_WAIT_MAX_S + 0.2
        else:
            assert answer == (None, False)
            assert waited_s < 0.1
    finally:
        h.close()


def wait_until(predicate: object, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():  # type: ignore[operator]
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.01)


def test_what_the_pipeline_holds_is_exported_and_returns_to_zero(harness: Harness) -> None:
    harness.metrics.set_pipeline_source(harness.scheduler.inflight)
    registry = harness.metrics.registry

    def held() -> dict[str, float | None]:
        name = "kvstore_pipeline_inflight"
        return {
            what: registry.get_sample_value(name, {"what": what})
            for what in ("cpu_pins", "disk_pins", "holds", "promoting", "jobs", "tracked_requests")
        }

    assert set(held().values()) == {0}  # every series exists before any request
    first = new_request("a", PROMPT)
    store_prompt(harness, first, [0, 1, 2])
    harness.scheduler.request_finished(first)
    again = new_request("b", PROMPT)
    harness.scheduler.track(again)
    harness.scheduler.get_num_new_matched_tokens(again, 0)
    harness.scheduler.update_state_after_alloc(again, kv_cache_blocks([7, 8, 9]), 2 * BLOCK)
    (load,) = step(harness, again, [7, 8, 9]).load_jobs
    during = held()
    assert during["cpu_pins"] == 2 and during["jobs"] == 1 and during["tracked_requests"] == 1
    report(harness, load.job_id)
    harness.scheduler.request_finished(again)
    assert set(held().values()) == {0}


def test_a_failing_pipeline_source_exports_zeros(harness: Harness) -> None:
    def broken() -> dict[str, int]:
        raise RuntimeError("boom")

    harness.metrics.set_pipeline_source(broken)
    value = harness.metrics.registry.get_sample_value("kvstore_pipeline_inflight", {"what": "jobs"})
    assert value == 0


def test_every_tier_has_a_hit_source_so_the_split_sums_to_the_hit() -> None:
    from kvstore.vllm.scheduler import HIT_SOURCES

    assert set(HIT_SOURCES) == set(Tier)  # a tier left out was dropped from vLLM's split
    assert HIT_SOURCES[Tier.REMOTE] is CacheHitSource.EXTERNAL_UNSPECIFIED


def test_steps_that_compute_a_chunk_are_timed_by_the_output_that_echoes_them(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The cost of recompute (`load_policy: cost`): a step's time runs from its metadata to
    the output the workers echo its id with; a step without tokens, whose output may never
    come, takes no part (it used to shift every later step by one)."""
    observed: list[tuple[int, float]] = []
    pipeline = harness.scheduler._pipeline
    monkeypatch.setattr(pipeline, "observe_step", lambda n, s: observed.append((n, s)))
    request = new_request("a", PROMPT)
    harness.scheduler.track(request)
    assert harness.scheduler.get_num_new_matched_tokens(request, 0) == (0, False)
    harness.scheduler.update_state_after_alloc(request, kv_cache_blocks([0, 1, 2]), 0)
    timed = step(harness, request, [0, 1, 2]).timed_step
    assert timed > 0
    idle = harness.scheduler.build_connector_meta(scheduler_output())
    assert idle.timed_step == 0
    harness.scheduler.update_connector_output(connector_output(KVStoreWorkerMetadata()))
    assert observed == []  # an output that is not the timed step's
    time.sleep(0.01)
    ranks = KVStoreWorkerMetadata(timed_steps=[timed]).aggregate(
        KVStoreWorkerMetadata(timed_steps=[timed])
    )
    assert isinstance(ranks, KVStoreWorkerMetadata) and ranks.timed_steps == [timed]
    harness.scheduler.update_connector_output(connector_output(ranks))
    harness.scheduler.update_connector_output(connector_output(ranks))  # echoed once only
    assert len(observed) == 1
    num_tokens, duration_s = observed[0]
    assert num_tokens == len(PROMPT) and 0 < duration_s < 5


def test_stores_done_in_the_step_a_request_finishes_still_wait_for_its_release(
    harness: Harness,
) -> None:
    """vLLM ends a request before it hands the connector that step's worker output: the
    request's last store completes in the same step, so no job is left, yet vLLM holds its
    blocks until the next step's `finished_sending` (a drain that stopped at "no job" left it
    tracked: the reliability suite's live-ops leak)."""
    request = new_request("a", PROMPT)
    harness.scheduler.track(request)
    harness.scheduler.get_num_new_matched_tokens(request, 0)
    (job,) = step(harness, request, [0, 1, 2]).store_jobs
    assert harness.scheduler.request_finished(request) == (True, None)
    report(harness, job.job_id)  # the same step's output: the store is done
    assert not harness.scheduler.has_pending_work()
    assert harness.scheduler.has_unreleased_requests()
    meta = harness.scheduler.build_connector_meta(scheduler_output())
    assert meta.finished_store_reqs == ["a"]
    report(harness, finished=frozenset({"a"}))
    assert not harness.scheduler.has_unreleased_requests()
    assert harness.scheduler.num_tracked_requests == 0
