"""Loads over the sync budget, on the real engine: vLLM parks the request in
WAITING_FOR_REMOTE_KVS while kvstore copies its hit a chunk per step, then schedules it.

The engine's own KV cache is small, so while a request is loading others are preempted (and
reload their prefix from kvstore when they resume), and one request is aborted in the middle of
its load. Both oracles hold: tokens equal to an engine without kvstore's, and the KV every load
left in vLLM's blocks equal to what that engine computed for the same tokens. The test checks
that each of these paths was taken, so a change of vLLM's admission policy fails it loudly.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from kvstore.oracle import BlockKV, GreedyRun
from kvstore.tiny_model import TinyLlamaSpec
from kvstore.vllm.engine import (
    engine,
    generate_runs,
    greedy_runs,
    kv_transfer_config,
    scheduler_connector,
)
from kvstore.vllm.kv_probe import computed_kv, loaded_kv
from tests.support.connector import drain, kvstore_summary
from tests.support.oracle import assert_audited, assert_kv_equal, assert_same_outputs

pytestmark = pytest.mark.engine

CHUNK_BYTES = TinyLlamaSpec().kv_bytes_per_token * 32  # one 32-token block, every layer
MAX_TOKENS = 72


def _prompt(seed: int, length: int) -> list[int]:
    return [(13 * i + 31 * seed + 7) % 500 + 5 for i in range(length)]


# The first wave (not stored: admitted at once and computed) decodes, its requests crossing a
# block boundary every few steps between them. The second wave is in kvstore: vLLM admits its
# first 28-chunk load (one chunk a step, 28 steps) into most of the free blocks, the first wave
# keeps growing into the rest, and vLLM preempts while that load is in flight (with this cache
# from 72 to 78 blocks, measured). A preempted request reloads its prompt's chunks (stored while
# it ran) from kvstore when it resumes.
FIRST_WAVE = [_prompt(j, 70 + 4 * j) for j in range(12)]  # 41 blocks once admitted
SECOND_WAVE = [_prompt(20 + j, 900) for j in range(3)]  # 28 chunks each, 29 blocks to admit
PROMPTS = FIRST_WAVE + SECOND_WAVE
ABORTED = len(FIRST_WAVE) + 1  # the second wave's second request, after 4 steps of loading
SMALL_ENGINE = {"kv_cache_bytes": 74 * CHUNK_BYTES, "max_model_len": 1024}
CONFIG = kv_transfer_config(
    cpu_bytes=512 * CHUNK_BYTES,  # room for everything: every hit is a full one
    audit_loads=True,
    sync_load_budget_bytes=2 * CHUNK_BYTES,  # a 2-chunk hit loads in its step, others cannot
    step_copy_budget_bytes=CHUNK_BYTES,  # queued loads copy one chunk per step
)


@pytest.fixture(scope="module")
def reference(tiny_model_dir: Path) -> tuple[list[GreedyRun], dict[bytes, BlockKV]]:
    """Without kvstore, with room for every request: greedy runs and the KV of every block."""
    with engine(tiny_model_dir, max_model_len=1024) as llm, computed_kv(llm) as computed:
        _, runs = generate_runs(llm, PROMPTS, max_tokens=MAX_TOKENS)
    return runs, computed.blocks


@dataclass
class _Observed:
    """What the engine did, step by step."""

    num_steps: int = 0
    max_waiting_for_kv: int = 0  # requests WAITING_FOR_REMOTE_KVS at once
    was_loading: bool = False  # a request was WAITING_FOR_REMOTE_KVS after the last step
    preempted_while_loading: int = 0  # preemptions in steps with a load in flight
    victim_steps: int = 0  # steps the request to abort has been loading
    aborted_mid_load: bool = False
    preemptions: dict[str, int] = field(default_factory=dict)
    outputs: dict[str, Any] = field(default_factory=dict)


def _step(llm: Any, ids: list[str], observed: _Observed) -> None:
    from vllm.v1.request import RequestStatus

    scheduler = llm.llm_engine.engine_core.engine_core.scheduler
    for output in llm.llm_engine.step():
        if output.finished:
            observed.outputs[output.request_id] = output
    observed.num_steps += 1
    waiting = [
        r for r in scheduler.requests.values() if r.status == RequestStatus.WAITING_FOR_REMOTE_KVS
    ]
    is_loading = bool(waiting) or observed.was_loading  # at the step's end or start
    observed.was_loading = bool(waiting)
    observed.max_waiting_for_kv = max(observed.max_waiting_for_kv, len(waiting))
    for req_id, request in scheduler.requests.items():
        if request.num_preemptions > observed.preemptions.get(req_id, 0) and is_loading:
            observed.preempted_while_loading += 1
        observed.preemptions[req_id] = request.num_preemptions
    victim = scheduler.requests.get(ids[ABORTED]) if len(ids) > ABORTED else None
    if victim is not None and victim.status == RequestStatus.WAITING_FOR_REMOTE_KVS:
        observed.victim_steps += 1
        if observed.victim_steps == 4:
            assert victim.request_id not in scheduler.finished_recving_kv_req_ids
            llm.llm_engine.abort_request([f"async-{ABORTED}"])
            observed.aborted_mid_load = True


def _run(llm: Any) -> _Observed:
    """The first wave, then the second as soon as the first is running (module comment)."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True, logprobs=2)

    def add(first: int, prompts: list[list[int]]) -> list[str]:
        return [
            llm.llm_engine.add_request(f"async-{first + i}", TokensPrompt(prompt_token_ids=p),
                                       params)
            for i, p in enumerate(prompts)
        ]  # fmt: skip

    ids = add(0, FIRST_WAVE)
    requests = llm.llm_engine.engine_core.engine_core.scheduler.requests
    observed = _Observed()
    while not all(r in requests and requests[r].num_output_tokens >= 1 for r in ids):
        _step(llm, ids, observed)
    ids += add(len(FIRST_WAVE), SECOND_WAVE)
    while llm.llm_engine.has_unfinished_requests():
        _step(llm, ids, observed)
        assert observed.num_steps < 2000, "the engine does not finish"
    return observed


def _check_clean(llm: Any) -> None:
    drain(llm)
    connector = scheduler_connector(llm)
    index = connector.runtime.index
    index.check_invariants()
    stats = index.stats()
    assert stats.cpu.num_pinned == 0 and stats.num_holds == 0
    assert connector.scheduler.num_inflight_jobs == 0
    assert connector.scheduler.num_tracked_requests == 0


def test_loads_over_several_steps_with_preemption_and_abort_are_exact(
    tiny_model_dir: Path, reference: tuple[list[GreedyRun], dict[bytes, BlockKV]]
) -> None:
    expected, reference_kv = reference
    with engine(tiny_model_dir, kv_transfer=CONFIG, **SMALL_ENGINE) as llm:
        generate_runs(llm, SECOND_WAVE, max_tokens=MAX_TOKENS)  # stores their chunks
        drain(llm)
        assert llm.reset_prefix_cache()  # only kvstore has them now
        with loaded_kv(llm) as loaded:
            observed = _run(llm)
        summary = kvstore_summary(llm)
        _check_clean(llm)
    counts = loaded.counts
    figures = (observed, counts, loaded.async_load_steps, loaded.num_preempted_loads)
    # the paths under test were taken ...
    assert counts.num_async_loads >= len(SECOND_WAVE), figures
    assert min(loaded.async_load_steps) >= 2 and max(loaded.async_load_steps) >= 28, figures
    assert observed.aborted_mid_load and counts.num_aborted_blocks == 28, figures
    assert observed.preempted_while_loading > 0 and loaded.num_preempted_loads > 0, figures
    # ... and both oracles hold
    finished = [i for i in range(len(PROMPTS)) if i != ABORTED]
    got = greedy_runs([observed.outputs[f"async-{i}"] for i in finished])
    assert_same_outputs([expected[i] for i in finished], got, num_equal=len(finished))
    kept = counts.num_blocks - counts.num_aborted_blocks
    assert counts.num_failed_blocks == 0 and summary["load_failed_chunks"] == 0
    assert_kv_equal(reference_kv, loaded, num_blocks=kept)
    assert_audited(summary)
