"""vLLM's own objects for the scheduler-half tests, built from the classes of the vLLM release
under test (0.32, 0.33 or 0.34: `make test-vllm-versions`), never hand-made look-alikes.

A fake that keeps a field the real class lost hides the break (0.34 dropped
`CachedRequestData.resumed_req_ids`; a hand-made fake still had it). So every object here is an
instance of vLLM's class, and only the fields the release defines are filled: a field kvstore
does not read gets an empty value of its declared type, and passing a field the release does not
have is a TypeError, as it would be in vLLM.

How vLLM reports a request resumed after preemption is release behaviour, not a field: 0.32 and
0.33 send it in `scheduled_cached_reqs` (in `resumed_req_ids`, its whole block table in
`new_block_ids`), 0.34 in `scheduled_new_reqs`. `resumed_in_new_reqs()` tells which, from the
class itself.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from vllm import SamplingParams
from vllm.v1.core.kv_cache_manager import KVCacheBlocks
from vllm.v1.core.kv_cache_utils import KVCacheBlock, get_request_block_hasher, init_none_hash
from vllm.v1.core.sched.output import CachedRequestData, NewRequestData, SchedulerOutput
from vllm.v1.outputs import KVConnectorOutput
from vllm.v1.request import Request

__all__ = [
    "connector_output",
    "kv_cache_blocks",
    "make_request",
    "resumed_in_new_reqs",
    "scheduler_output",
]

_HASH_BLOCKS: dict[int, Any] = {}


def _empty(field: dataclasses.Field[Any]) -> Any:
    """An empty value of a required field's declared type (a string annotation)."""
    declared = field.type
    kind = declared if isinstance(declared, str) else getattr(declared, "__name__", str(declared))
    for prefix, value in (("list", []), ("dict", {}), ("set", set()), ("tuple", ())):
        if kind.startswith(prefix):
            return value
    if "None" in kind:
        return None
    if kind.startswith("int"):
        return 0
    if kind.startswith("bool"):
        return False
    raise TypeError(f"no empty value for {field.name}: {kind}")


def build(cls: type, **values: Any) -> Any:
    """`cls(**values)`, other required fields empty; an unknown field is a TypeError."""
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = set(values) - set(fields)
    if unknown:
        raise TypeError(f"{cls.__name__} of this vLLM has no field(s) {sorted(unknown)}")
    for name, field in fields.items():
        required = (
            field.init
            and field.default is dataclasses.MISSING
            and field.default_factory is dataclasses.MISSING
        )
        if required and name not in values:
            values[name] = _empty(field)
    return cls(**values)


def resumed_in_new_reqs() -> bool:
    """Whether this vLLM sends resumed requests in `scheduled_new_reqs` (0.34) rather than in
    `scheduled_cached_reqs` with `resumed_req_ids` (0.32, 0.33)."""
    return "resumed_req_ids" not in {f.name for f in dataclasses.fields(CachedRequestData)}


def make_request(req_id: str, token_ids: Sequence[int], *, block_size: int) -> Request:
    """A real vLLM request whose `block_hashes` are vLLM's own (sha256 chain, `block_size`
    tokens per hash), as the engine computes them."""
    from vllm.utils.hashing import sha256

    hasher = _HASH_BLOCKS.get(block_size)
    if hasher is None:
        init_none_hash(sha256)
        hasher = _HASH_BLOCKS[block_size] = get_request_block_hasher(block_size, sha256)
    return Request(
        request_id=req_id,
        prompt_token_ids=list(token_ids),
        sampling_params=SamplingParams(max_tokens=16),
        pooling_params=None,
        block_hasher=hasher,
    )


def kv_cache_blocks(block_ids: Sequence[int]) -> KVCacheBlocks:
    """vLLM's `KVCacheBlocks` for one KV cache group."""
    return KVCacheBlocks(([KVCacheBlock(block_id) for block_id in block_ids],))


def scheduler_output(
    *,
    new: Mapping[str, Sequence[int]] | None = None,
    cached: Mapping[str, Sequence[int] | None] | None = None,
    resumed: Mapping[str, Sequence[int]] | None = None,
    num_scheduled_tokens: Mapping[str, int] | None = None,
    preempted: set[str] | None = None,
) -> SchedulerOutput:
    """A step's `SchedulerOutput`: `new` requests with their block tables, `cached` ones with
    the blocks appended this step, `resumed` ones with their new whole table (sent the way
    this vLLM sends them), the tokens scheduled per request and the preempted requests."""
    new_reqs = dict(new or {})
    cached_reqs: dict[str, Sequence[int] | None] = dict(cached or {})
    cached_values: dict[str, Any] = {}
    if resumed and resumed_in_new_reqs():
        new_reqs.update(resumed)
    elif resumed:
        cached_reqs.update(resumed)
        cached_values["resumed_req_ids"] = set(resumed)
    new_data = [
        build(NewRequestData, req_id=req_id, block_ids=(list(blocks),))
        for req_id, blocks in new_reqs.items()
    ]
    cached_data = build(
        CachedRequestData,
        req_ids=list(cached_reqs),
        new_block_ids=[None if b is None else (list(b),) for b in cached_reqs.values()],
        **cached_values,
    )
    scheduled = dict(num_scheduled_tokens or {})
    return build(
        SchedulerOutput,
        scheduled_new_reqs=new_data,
        scheduled_cached_reqs=cached_data,
        num_scheduled_tokens=scheduled,
        total_num_scheduled_tokens=sum(scheduled.values()),
        preempted_req_ids=set(preempted or ()),
    )


def connector_output(
    worker_meta: Any = None, *, finished_sending: set[str] | None = None
) -> KVConnectorOutput:
    """vLLM's `KVConnectorOutput` as the workers' aggregate reaches the scheduler."""
    return build(
        KVConnectorOutput,
        kv_connector_worker_meta=worker_meta,
        finished_sending=set(finished_sending or ()),
    )
