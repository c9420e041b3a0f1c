"""How long a lookup waits, in the lookup, for what it started below CPU: a disk promotion, or
a remote probe and then its fetch, all within `promotion_wait_s` (a fast tier then costs the
request no scheduler step). Waiting is blocking on the service's completions, without the GIL;
a tier whose measured speed says it would not answer in time is not waited for at all. The only
request in the engine waits longer, up to its own budget: no other request's step is held up,
and the engine does not step idle beside the I/O it waits for."""

from __future__ import annotations

import time
from collections.abc import Callable

from kvstore.keys import Tier
from kvstore.pipeline.load_cost import LoadCostModel
from kvstore.pipeline.lookups import OwnerState
from kvstore.pipeline.remote import RemoteSteps

__all__ = ["ALONE_WAIT_MAX_S", "LookupWaits"]

ALONE_WAIT_MAX_S = 0.25
"""The most the lookup of the only request in the engine blocks on a tier below CPU (a request
that arrives meanwhile is scheduled after it)."""


class LookupWaits:
    def __init__(
        self, poll: Callable[[float], None], cost: LoadCostModel | None, wait_s: float
    ) -> None:
        self._poll = poll  # applies completions, blocking up to its argument for the first
        self._cost = cost
        self._wait_s = wait_s

    def promotion(self, state: OwnerState, num_chunks: int, *, is_alone: bool = False) -> bool:
        """Whether `state`'s promotion of `num_chunks` landed within the wait; `is_alone`: no
        other request is in the engine (`_alone_wait_s`)."""
        wait_s = self._wait_s
        if is_alone and wait_s > 0:  # 0: the operator wants no lookup to block
            wait_s = max(wait_s, self._alone_wait_s(state))
        if self._cost is not None:
            expected_s = self._cost.load_s(Tier.DISK, num_chunks)
            if expected_s is not None and expected_s > wait_s:
                return False
        return self._until(lambda: not state.promoting, time.monotonic() + wait_s)

    def _alone_wait_s(self, state: OwnerState) -> float:
        """How long the lookup of the only request in the engine waits for its promotion: no
        other request's step is held up meanwhile, and blocked here the scheduler leaves the
        cores to the read (pending, the request costs the engine idle steps until the read
        lands: 5-6 of them for a 32 MiB disk hit in one trace). Up to the request's own
        deadline, which it would wait through anyway, and at most `ALONE_WAIT_MAX_S` (a
        request that arrives meanwhile waits for the lookup)."""
        left_s = None if self._cost is None else self._cost.seconds_until(state.deadline_s)
        return min(ALONE_WAIT_MAX_S, ALONE_WAIT_MAX_S if left_s is None else left_s)

    def remote(
        self, remote: RemoteSteps, owner: str, until_s: float | None, *, is_alone: bool = False
    ) -> float | None:
        """Wait until `until_s` (first call: the wait from now, `ALONE_WAIT_MAX_S` when
        `is_alone`: no other request is in the engine), and no longer than `owner`'s own
        budget, for its remote probe or fetch to answer; returns `until_s` if it did, else
        None."""
        if until_s is None:
            is_longer = is_alone and self._wait_s > 0  # 0: the operator wants no lookup to block
            until_s = time.monotonic() + (ALONE_WAIT_MAX_S if is_longer else self._wait_s)
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
