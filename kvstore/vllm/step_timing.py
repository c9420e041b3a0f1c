"""`StepTimer`: how long the engine takes to compute a token, from its own steps (the cost of
recompute that `load_policy: cost` weighs loads against).

A step that computes at least a chunk of tokens is timed: its id goes to the workers in the
step's metadata, and they echo it with the step's output. Under async scheduling the next step
is scheduled while this one runs, so a step's compute starts at the previous output, not at its
schedule.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterable

__all__ = ["StepTimer"]

_MAX_OPEN = 4  # timed steps whose output never came back (a failed step) are forgotten


class StepTimer:
    """Owned by the scheduler half; `observe(num_tokens, seconds)` gets each timed step."""

    def __init__(self, min_tokens: int, observe: Callable[[int, float], None]) -> None:
        self._min_tokens = min_tokens
        self._observe = observe
        self._ids = itertools.count(1)
        self._open: dict[int, tuple[float, int]] = {}  # step id -> (scheduled at, tokens)
        self._last_output_s = 0.0

    def start(self, num_tokens: int) -> int:
        """A step of `num_tokens` is scheduled: its id (0: not timed, too few tokens)."""
        if num_tokens < self._min_tokens:
            return 0
        step_id = next(self._ids)
        self._open[step_id] = (time.perf_counter(), num_tokens)
        while len(self._open) > _MAX_OPEN:
            del self._open[next(iter(self._open))]
        return step_id

    def outputs(self, step_ids: Iterable[int]) -> None:
        """Outputs are back, echoing these timed steps."""
        now = time.perf_counter()
        for step_id in step_ids:
            timed = self._open.pop(step_id, None)
            if timed is not None:
                scheduled_s, num_tokens = timed
                self._observe(num_tokens, now - max(scheduled_s, self._last_output_s))
        self._last_output_s = now
