"""How long a lookup waits, in the lookup, for what it started below CPU: a disk promotion, or
a remote probe and then its fetch, all within `promotion_wait_s` (a fast tier then costs the
request no scheduler step). Waiting is blocking on the service's completions, without the GIL;
a tier whose measured speed says it would not answer in time is not waited for at all."""

from __future__ import annotations

import time
from collections.abc import Callable

from kvstore.keys import Tier
from kvstore.pipeline.load_cost import LoadCostModel
from kvstore.pipeline.lookups import OwnerState
from kvstore.pipeline.remote import RemoteSteps

__all__ = ["LookupWaits"]


class LookupWaits:
    def __init__(
        self, poll: Callable[[float], None], cost: LoadCostModel | None, wait_s: float
    ) -> None:
        self._poll = poll  # applies completions, blocking up to its argument for the first
        self._cost = cost
        self._wait_s = wait_s

    def promotion(self, state: OwnerState, num_chunks: int) -> bool:
        """Whether `state`'s promotion of `num_chunks` landed within the wait."""
        if self._cost is not None:
            expected_s = self._cost.load_s(Tier.DISK, num_chunks)
            if expected_s is not None and expected_s > self._wait_s:
                return False
        return self._until(lambda: not state.promoting, time.monotonic() + self._wait_s)

    def remote(self, remote: RemoteSteps, owner: str, until_s: float | None) -> float | None:
        """Wait until `until_s` (first call: the wait from now), and no longer than `owner`'s
        own budget, for its remote probe or fetch to answer; returns `until_s` if it did,
        else None."""
        until_s = time.monotonic() + self._wait_s if until_s is None else until_s
        left_s = remote.seconds_left(owner)
        if left_s is not None:  # not past the requester's own budget (load_policy: cost)
            until_s = min(until_s, time.monotonic() + max(0.0, left_s))
        num_chunks = remote.num_waited_chunks(owner)
        expected_s = None
        if num_chunks is not None and self._cost is not None:
            expected_s = self._cost.load_s(Tier.REMOTE, num_chunks)
        if expected_s is not None and time.monotonic() + expected_s > until_s:
            return None
        is_answered = self._until(lambda: remote.num_waited_chunks(owner) is None, until_s)
        return until_s if is_answered else None

    def _until(self, is_done: Callable[[], bool], deadline_s: float) -> bool:
        while not is_done():
            left_s = deadline_s - time.monotonic()
            if left_s <= 0:
                return False
            self._poll(left_s)
        return True
