"""KVStoreConnector under vLLM's own `Scheduler` (the release under test): stores, hits,
preemption and resume, with every context position checked against what computing it writes
(`vllm_loop`). Runs on vLLM 0.32 here and on 0.33/0.34 in `make test-vllm-versions`."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kvstore.vllm.compat import resumed_req_ids
from kvstore.vllm.scheduler import ConnectorScheduler

from .vllm_loop import BLOCK, Loop, make_loop
from .vllm_objects import resumed_in_new_reqs


@pytest.fixture
def loop(tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Loop]:
    made = make_loop(tiny_model_dir, tmp_path, monkeypatch)
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
    follow = ConnectorScheduler._update_block_ids

    def append_on_resume(self: ConnectorScheduler, output: Any) -> None:
        old = {req_id: list(state.block_ids) for req_id, state in self._reqs.items()}
        follow(self, output)
        resumed = {data.req_id for data in output.scheduled_new_reqs}
        resumed |= set(resumed_req_ids(output.scheduled_cached_reqs))
        for req_id in resumed & set(old):
            if old[req_id]:
                self._reqs[req_id].block_ids = old[req_id] + self._reqs[req_id].block_ids

    monkeypatch.setattr(ConnectorScheduler, "_update_block_ids", append_on_resume)
    loop = make_loop(tiny_model_dir, tmp_path, monkeypatch, num_blocks=7)
    try:
        run_with_preemption(loop)
        assert loop.num_bad_positions > 0
    finally:
        loop.close()
