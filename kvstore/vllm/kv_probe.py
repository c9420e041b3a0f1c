"""Copies of KV out of an in-process vLLM engine's cache, for the reference-KV oracle.

`kvstore.oracle.compare_kv` compares the KV that connector loads put into an engine's cache with
the KV an engine without kvstore computed for the same tokens. These probes collect both sides:

- `LoadProbe`, on the engine with the connector: for every load vLLM asks for (its call to the
  connector's `update_state_after_alloc` with external tokens), the blocks *vLLM* allocated for
  those token positions (its own block table, not the block ids of kvstore's copy jobs), read
  when the load is over, as the engine's forward will read them: a sync load after the step
  that scheduled it, an asynchronous one after the step whose output reported it received.
  Blocks vLLM no longer counts as computed after a failed load (it recomputes them) are not
  kept, only counted; nor are the blocks of a request aborted before its load finished.
- `ComputeProbe`, on the reference engine: the KV of each block it computed whose hash is
  wanted, read from vLLM's prefix cache after the step that computed it (a full block gets its
  hash when scheduled; after that step's forward it holds the KV, until it is evicted, which
  only happens in a later step's scheduling).

Both wrap the engine core's step in single-process mode (`VLLM_ENABLE_V1_MULTIPROCESSING=0`,
what `kvstore.vllm.engine.engine` starts) and read the model runner's KV tensors. Blocks are
named by vLLM's prefix-cache hash of the block, the same in both engines (sha256 chains start
from a fixed seed; with xxhash set `PYTHONHASHSEED`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch

from kvstore.oracle import BlockKV
from tiers.paged import find_block_dim

__all__ = ["ComputeProbe", "LoadCounts", "LoadProbe", "computed_kv", "loaded_kv"]


class _EngineCache:
    """The KV tensors and scheduler of an in-process engine."""

    def __init__(self, llm: Any) -> None:
        core = getattr(llm.llm_engine.engine_core, "engine_core", None)
        if core is None:
            raise RuntimeError(
                "KV probes need the engine in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0)"
            )
        self.core = core
        self.scheduler = core.scheduler
        self.block_size = int(self.scheduler.block_size)
        hash_size = int(self.scheduler.hash_block_size)
        if hash_size != self.block_size:
            raise RuntimeError(f"KV probes need one prefix hash per block; hash blocks are "
                               f"{hash_size} tokens, engine blocks {self.block_size}")  # fmt: skip
        kv_cache_config = self.scheduler.kv_cache_config
        num_blocks = int(kv_cache_config.num_blocks)
        runner = core.model_executor.driver_worker.worker.model_runner
        self._layers = [(cache, _block_dim(cache.shape, num_blocks)) for cache in runner.kv_caches]
        self.group_layers = _group_layers(kv_cache_config.kv_cache_groups, len(self._layers))

    @property
    def num_groups(self) -> int:
        return len(self.group_layers)

    def read(self, block_id: int, group: int = 0) -> tuple[torch.Tensor, ...]:
        """A copy of one block's KV, per layer of KV cache group `group` (a hybrid engine's
        groups share the KV tensors: a block id holds the KV of the group that owns it)."""
        return tuple(
            self._layers[i][0].select(self._layers[i][1], block_id).clone()
            for i in self.group_layers[group]
        )

    def name(self, block_hash: bytes, group: int) -> bytes:
        """A block's name in both engines: its prefix-cache hash, and with several KV cache
        groups the group too (each group has its own block of the same hash)."""
        return block_hash if self.num_groups == 1 else block_hash + b"/group" + bytes([group])

    @contextmanager
    def around_steps(self, before: Callable[[], None], after: Callable[[], None]) -> Iterator[None]:
        step = self.core.step_fn

        def probed_step() -> Any:
            before()
            result = step()
            after()
            return result

        self.core.step_fn = probed_step
        try:
            yield
        finally:
            self.core.step_fn = step


def _group_layers(groups: Sequence[Any], num_layers: int) -> list[list[int]]:
    """Each KV cache group's positions in the model runner's `kv_caches` list, which vLLM
    orders by layer index (`bind_kv_cache`); one group: every layer."""
    if len(groups) == 1:
        return [list(range(num_layers))]
    from vllm.model_executor.models.utils import extract_layer_index

    indexes = sorted({extract_layer_index(n) for group in groups for n in group.layer_names})
    position = {index: i for i, index in enumerate(indexes)}
    return [[position[extract_layer_index(n)] for n in group.layer_names] for group in groups]


def _block_dim(shape: Sequence[int], num_blocks: int) -> int:
    dim = find_block_dim(shape, num_blocks)
    if dim < 0:
        raise RuntimeError(f"no dim of a KV tensor {tuple(shape)} holds {num_blocks} blocks")
    return dim


@dataclass(slots=True)
class _Load:
    request: Any
    is_async: bool
    blocks: list[tuple[int, int, int]]  # (group, position in the request, vLLM's block id)
    num_steps: int = 0  # steps it has been in flight


@dataclass(slots=True)
class LoadCounts:
    num_loads: int = 0
    num_async_loads: int = 0  # over later steps, the request WAITING_FOR_REMOTE_KVS
    num_blocks: int = 0  # blocks connector loads were asked to fill
    num_failed_blocks: int = 0  # ... that vLLM recomputed after a failed load
    num_aborted_blocks: int = 0  # ... of requests aborted before their load finished


@dataclass(slots=True)
class LoadProbe:
    """The KV each connector load put into the engine's blocks (module docstring)."""

    blocks: list[BlockKV] = field(default_factory=list)
    counts: LoadCounts = field(default_factory=LoadCounts)
    num_preempted_loads: int = 0  # loads of requests vLLM had preempted before (resumed)
    async_load_steps: list[int] = field(default_factory=list)  # steps each async load took
    _local: dict[str, tuple[int, bool]] = field(default_factory=dict)
    _pending: list[_Load] = field(default_factory=list)

    def on_lookup(self, request: Any, num_computed_tokens: int, answer: tuple[Any, bool]) -> None:
        num_tokens, is_async = answer
        if num_tokens:
            self._local[request.request_id] = (num_computed_tokens, is_async)

    def on_alloc(self, cache: _EngineCache, request: Any, blocks: Any, num_external: int) -> None:
        looked_up = self._local.pop(request.request_id, None)
        if num_external <= 0:
            return
        if looked_up is None:
            raise RuntimeError(f"request {request.request_id}: an allocation for "
                               f"{num_external} external tokens without a lookup")  # fmt: skip
        num_local, is_async = looked_up
        size = cache.block_size
        first, end = num_local // size, (num_local + num_external) // size
        # a hybrid engine's sliding-window groups hold vLLM's null block (0) outside the window
        filled = [
            (group, index, block_id)
            for group, ids in enumerate(blocks.get_block_ids())
            for index, block_id in enumerate(ids[first:end], start=first)
            if cache.num_groups == 1 or block_id != 0
        ]
        self._pending.append(_Load(request, is_async, filled))
        self.counts.num_loads += 1
        self.counts.num_async_loads += int(is_async)
        self.counts.num_blocks += len(filled)
        self.num_preempted_loads += int(request.num_preemptions > 0)

    def after_step(self, cache: _EngineCache) -> None:
        scheduler = cache.scheduler
        waiting = []
        for load in self._pending:
            load.num_steps += 1
            req_id = load.request.request_id
            if load.is_async and req_id not in scheduler.finished_recving_kv_req_ids:
                if load.request.is_finished():
                    self.counts.num_aborted_blocks += len(load.blocks)
                else:
                    waiting.append(load)
                continue
            if load.is_async:
                self.async_load_steps.append(load.num_steps)
            self._read(cache, load)
        self._pending = waiting

    def _read(self, cache: _EngineCache, load: _Load) -> None:
        request = load.request
        num_valid = len(request.block_hashes)
        if not request.is_finished():  # after a failed load vLLM recomputes from here on
            num_valid = min(num_valid, request.num_computed_tokens // cache.block_size)
        for group, index, block_id in load.blocks:
            if index >= num_valid:
                self.counts.num_failed_blocks += 1
                continue
            name = cache.name(bytes(request.block_hashes[index]), group)
            self.blocks.append(BlockKV(name, cache.read(block_id, group)))

    @property
    def num_pending(self) -> int:
        return len(self._pending)


@dataclass(slots=True)
class ComputeProbe:
    """The KV the engine computed for the blocks whose hash is in `wanted` (None: all)."""

    wanted: frozenset[bytes] | None = None
    blocks: dict[bytes, BlockKV] = field(default_factory=dict)
    _candidates: set[bytes] = field(default_factory=set)

    def before_step(self, cache: _EngineCache) -> None:
        for request in cache.scheduler.requests.values():
            hashes = {bytes(h) for h in request.block_hashes}
            if self.wanted is not None:
                hashes &= self.wanted
            self._candidates |= {h for h in hashes if cache.name(h, 0) not in self.blocks}

    def after_step(self, cache: _EngineCache) -> None:
        pool = cache.scheduler.kv_cache_manager.block_pool
        found = []
        for block_hash in self._candidates:
            for group in range(cache.num_groups):
                name = cache.name(block_hash, group)
                if name in self.blocks:
                    continue
                cached = pool.get_cached_block(block_hash, [group])
                if cached:
                    self.blocks[name] = BlockKV(name, cache.read(cached[0].block_id, group))
            if all(cache.name(block_hash, g) in self.blocks for g in range(cache.num_groups)):
                found.append(block_hash)
        self._candidates.difference_update(found)


@contextmanager
def loaded_kv(llm: Any) -> Iterator[LoadProbe]:
    """Record, while the block runs, the KV each load of the engine's KV connector put into
    its cache (the scheduler-side connector's lookups and allocations are observed)."""
    cache = _EngineCache(llm)
    connector = cache.scheduler.connector
    if connector is None:
        raise RuntimeError("this engine has no KV connector: nothing loads")
    probe = LoadProbe()
    lookup, alloc = connector.get_num_new_matched_tokens, connector.update_state_after_alloc

    def observed_lookup(request: Any, num_computed_tokens: int) -> tuple[Any, bool]:
        answer: tuple[Any, bool] = lookup(request, num_computed_tokens)
        probe.on_lookup(request, num_computed_tokens, answer)
        return answer

    def observed_alloc(request: Any, blocks: Any, num_external_tokens: int) -> None:
        alloc(request, blocks, num_external_tokens)
        probe.on_alloc(cache, request, blocks, num_external_tokens)

    connector.get_num_new_matched_tokens = observed_lookup
    connector.update_state_after_alloc = observed_alloc
    try:
        with cache.around_steps(lambda: None, lambda: probe.after_step(cache)):
            yield probe
    finally:
        del connector.get_num_new_matched_tokens, connector.update_state_after_alloc


@contextmanager
def computed_kv(llm: Any, wanted: frozenset[bytes] | None = None) -> Iterator[ComputeProbe]:
    """Record, while the block runs, the KV the engine computes for the blocks in `wanted`."""
    cache = _EngineCache(llm)
    probe = ComputeProbe(wanted)
    with cache.around_steps(lambda: probe.before_step(cache), lambda: probe.after_step(cache)):
        yield probe
