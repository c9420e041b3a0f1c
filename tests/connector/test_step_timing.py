"""`StepTimer`: the engine's steps as the measure of recompute (no vLLM needed)."""

from __future__ import annotations

import time

from kvstore.vllm.step_timing import StepTimer


def test_only_steps_of_a_chunk_or_more_are_timed_and_each_is_observed_once() -> None:
    seen: list[tuple[int, float]] = []
    timer = StepTimer(16, lambda tokens, seconds: seen.append((tokens, seconds)))
    assert timer.start(8) == 0  # a decode-sized step says little about prefill
    first = timer.start(64)
    assert first > 0
    time.sleep(0.01)
    timer.outputs([first, first, 999])
    assert len(seen) == 1 and seen[0][0] == 64 and seen[0][1] >= 0.01


def test_a_step_scheduled_while_the_previous_ran_is_timed_from_that_output() -> None:
    seen: list[float] = []
    timer = StepTimer(16, lambda tokens, seconds: seen.append(seconds))
    a = timer.start(32)
    b = timer.start(32)  # async scheduling: scheduled before a's output
    time.sleep(0.05)
    timer.outputs([a])
    time.sleep(0.01)
    timer.outputs([b])
    assert seen[0] >= 0.05 and seen[1] < 0.04  # b's compute began at a's output


def test_outputs_that_never_come_back_are_forgotten() -> None:
    seen: list[float] = []
    timer = StepTimer(16, lambda tokens, seconds: seen.append(seconds))
    ids = [timer.start(32) for _ in range(10)]
    timer.outputs(ids)
    assert len(seen) == 4  # only the newest few stay open
