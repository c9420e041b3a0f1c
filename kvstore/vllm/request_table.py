"""`RequestTable`: the requests the scheduler-side connector tracks, from arrival to cleanup,
and the block table it follows for each from vLLM's scheduler output."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from kvstore.vllm.compat import resumed_req_ids
from kvstore.vllm.requests import RequestState

if TYPE_CHECKING:
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.request import Request

__all__ = ["RequestTable"]


class RequestTable:
    """Request id -> `RequestState`. Called only from vLLM's scheduler thread."""

    def __init__(self) -> None:
        self._states: dict[str, RequestState] = {}

    def state(self, request: Request) -> RequestState:
        """`request`'s state, tracked from now on if it was not."""
        state = self._states.get(request.request_id)
        if state is None:
            state = RequestState(request.request_id, request)
            self._states[request.request_id] = state
        return state

    def get(self, req_id: str) -> RequestState | None:
        return self._states.get(req_id)

    def drop(self, req_id: str) -> None:
        self._states.pop(req_id, None)

    def is_alone(self, state: RequestState) -> bool:
        """Whether `state`'s is the only live request (no other would be scheduled while its
        lookup blocks). Stops at the first other live one."""
        return not any(
            other is not state and not other.is_finished for other in self._states.values()
        )

    def follow_block_ids(self, scheduler_output: SchedulerOutput) -> None:
        """Follow each request's block table: new requests (and, on vLLM 0.34, resumed ones)
        bring it whole; running ones append to it, resumed ones on 0.32/0.33 replace it."""
        for data in scheduler_output.scheduled_new_reqs:
            state = self._states.get(data.req_id)
            if state is not None:
                state.block_ids = [list(ids) for ids in data.block_ids]
        cached = scheduler_output.scheduled_cached_reqs
        resumed = resumed_req_ids(cached)
        for req_id, new_block_ids in zip(cached.req_ids, cached.new_block_ids, strict=True):
            state = self._states.get(req_id)
            if state is None:
                continue
            if req_id in resumed:
                state.block_ids = [list(ids) for ids in new_block_ids or ()]
            elif new_block_ids:
                if not state.block_ids:
                    state.block_ids = [[] for _ in new_block_ids]
                for ids, new in zip(state.block_ids, new_block_ids, strict=True):
                    ids.extend(new)

    def __iter__(self) -> Iterator[RequestState]:
        return iter(self._states.values())

    def __len__(self) -> int:
        return len(self._states)
