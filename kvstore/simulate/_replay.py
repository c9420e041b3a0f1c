"""The replay: prompts through the real `TierIndex` of one engine or of several replicas sharing
a remote tier (see the package docstring)."""

from __future__ import annotations

import itertools
import random
from collections import Counter, OrderedDict
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field

from kvstore.events import ChunkRemoved
from kvstore.hashing import chunk_keys
from kvstore.index import IndexConfig, TierIndex
from kvstore.keys import BlockKey, Tier
from kvstore.simulate._result import COUNTED, ReplicaSimulation, SimulationResult

__all__ = ["ROUTINGS", "SharedRemote", "simulate", "simulate_replicas", "sweep"]

ROUTINGS = ("round-robin", "random")
"""How requests reach replicas: in turn, or uniformly at random (seeded)."""


class _KeyLRU:
    """Chunk keys in least-recently-used order, at most `num_chunks` of them."""

    def __init__(self, num_chunks: int) -> None:
        self.num_chunks = num_chunks
        self._keys: OrderedDict[BlockKey, None] = OrderedDict()

    def num_leading(self, keys: Sequence[BlockKey]) -> int:
        """How many of `keys`, from the first, are held (a probe: no access)."""
        num_found = 0
        for key in keys:
            if key not in self._keys:
                break
            num_found += 1
        return num_found

    def touch(self, keys: Iterable[BlockKey]) -> None:
        """An access to each of `keys` that is held."""
        for key in keys:
            if key in self._keys:
                self._keys.move_to_end(key)

    def add(self, keys: Iterable[BlockKey]) -> int:
        """Hold `keys` (most recent last); returns how many keys were evicted to make room."""
        for key in keys:
            self._keys[key] = None
            self._keys.move_to_end(key)
        num_evicted = 0
        while len(self._keys) > self.num_chunks:
            self._keys.popitem(last=False)
            num_evicted += 1
        return num_evicted


class _EngineCache(_KeyLRU):
    """The engine's own prefix cache, as an LRU of chunk keys (0 chunks: no cache)."""

    def use(self, keys: Sequence[BlockKey]) -> None:
        if self.num_chunks:
            self.add(keys)


def _serve(index: TierIndex, keys: Sequence[BlockKey], counts: Counter[str]) -> int:
    """Look up, promote and load `keys` as the connector would; returns the number of hits."""
    result = index.lookup(keys)
    counts["num_cpu_hit_chunks"] += result.num_cpu_hits
    counts["num_disk_hit_chunks"] += result.num_disk_hits
    if result.num_disk_hits:
        promotion = index.plan_promotion(result.keys)
        index.complete_promotion(promotion.keys, success=True)
        counts["num_promoted_chunks"] += len(promotion.keys)
    load = index.prepare_load(result.keys)
    if result.num_disk_hits:
        index.release(result.keys)
    index.complete_load(load.keys)
    return result.num_hits


def _store(
    index: TierIndex,
    prompt: Sequence[int],
    keys: Sequence[BlockKey],
    num_cached: int,
    counts: Counter[str],
) -> tuple[BlockKey, ...]:
    """Store the chunks after the first `num_cached` (the engine computed them), write through;
    returns the chunks that got CPU rows."""
    num_tokens = index.config.num_tokens_per_chunk
    computed = keys[num_cached:]
    stored: tuple[BlockKey, ...] = ()
    if computed:
        plan = index.prepare_store(
            computed,
            token_ids=prompt[num_cached * num_tokens : len(keys) * num_tokens],
            parent_key=keys[num_cached - 1] if num_cached else None,
        )
        if plan is not None:
            index.complete_store(plan.keys, success=True)
            counts["num_stored_chunks"] += len(plan.keys)
            stored = plan.keys
    write = index.plan_write_through()
    index.complete_write_through(write.keys, success=True)
    counts["num_written_chunks"] += len(write.keys)
    return stored


def _count_evictions(index: TierIndex, counts: Counter[str]) -> None:
    for event in index.take_events():
        if isinstance(event, ChunkRemoved):
            name = "num_cpu_evicted_chunks" if event.tier is Tier.CPU else "num_disk_evicted_chunks"
            counts[name] += len(event.keys)


class SharedRemote(_KeyLRU):
    """The remote tier as Redis runs it with `maxmemory` and `allkeys-lru`, shared by every
    replica: a probe (EXISTS) is not an access, a fetch (GET) and a write (SET) are; a write past
    capacity evicts the least recently used chunk. Exact LRU (Redis samples keys to approximate
    it); capacity counts whole chunks (the 40-byte value header and Redis's per-key overhead,
    well under 1% of a chunk, are left out)."""

    def __init__(self, num_chunks: int) -> None:
        if num_chunks < 1:
            raise ValueError(f"a remote tier holds at least one chunk, got {num_chunks}")
        super().__init__(num_chunks)

    fetch = _KeyLRU.touch
    store = _KeyLRU.add


def _fetch_remote(
    index: TierIndex,
    remote: SharedRemote,
    local: Sequence[BlockKey],
    rest: Sequence[BlockKey],
    counts: Counter[str],
) -> int:
    """Serve the leading run of `rest` the remote tier holds: CPU rows for it (the `local`
    prefix protected), fetched, ready; returns the number of chunks served."""
    wanted = rest[: remote.num_leading(rest)]
    if not wanted:
        return 0
    plan = index.prepare_store([*local, *wanted])
    if plan is None:
        return 0
    remote_keys = set(wanted)
    fetched = [key for key in plan.keys if key in remote_keys]
    others = [key for key in plan.keys if key not in remote_keys]
    if others:  # a local chunk that left CPU meanwhile: its row goes back
        index.complete_store(others, success=False)
    remote.fetch(fetched)
    index.complete_store(fetched, success=True)
    counts["num_remote_hit_chunks"] += len(fetched)
    return len(fetched)


@dataclass
class _Replica:
    """One engine: its prefix cache, its index (CPU and disk tiers) and its tallies."""

    index: TierIndex
    engine: _EngineCache
    counts: Counter[str] = field(default_factory=Counter)

    def serve(self, prompt: Sequence[int], remote: SharedRemote | None) -> None:
        index, counts = self.index, self.counts
        keys = chunk_keys(prompt, index.config.num_tokens_per_chunk)
        num_engine_hits = self.engine.num_leading(keys)
        num_cached = self._serve_prefix(keys, num_engine_hits, remote)
        stored = _store(index, prompt, keys, num_cached, counts)
        if remote is not None and stored:
            counts["num_remote_written_chunks"] += len(stored)
            counts["num_remote_evicted_chunks"] += remote.store(stored)
        _count_evictions(index, counts)
        self.engine.use(keys)
        counts["num_requests"] += 1
        counts["num_prompt_tokens"] += len(prompt)
        counts["num_chunks"] += len(keys)
        counts["num_engine_hit_chunks"] += num_engine_hits

    def _serve_prefix(
        self, keys: Sequence[BlockKey], num_engine_hits: int, remote: SharedRemote | None
    ) -> int:
        """The longest prefix served, as the pipeline asks: CPU and disk, then the remote tier
        for what follows, then the local tiers again past what it fetched, until neither adds."""
        index, counts = self.index, self.counts
        num_cached = num_engine_hits + _serve(index, keys[num_engine_hits:], counts)
        while remote is not None and num_cached < len(keys):
            local = keys[num_engine_hits:num_cached]
            num_fetched = _fetch_remote(index, remote, local, keys[num_cached:], counts)
            if not num_fetched:
                break
            num_cached += num_fetched
            num_cached += _serve(index, keys[num_cached:], counts)
        return num_cached


def _routes(num_replicas: int, routing: str, seed: int) -> Iterator[int]:
    """The replica of each request, endlessly."""
    if routing == "round-robin":
        return itertools.cycle(range(num_replicas))
    rng = random.Random(seed)
    return (rng.randrange(num_replicas) for _ in itertools.count())


def simulate_replicas(
    trace: Iterable[Sequence[int]],
    *,
    num_replicas: int,
    remote_bytes: int,
    num_tokens_per_chunk: int,
    cpu_rows: int,
    disk_bytes: int,
    chunk_bytes: int,
    policy: str,
    engine_chunks: int = 0,
    admission_min_sightings: int = 1,
    routing: str = "round-robin",
    seed: int = 0,
) -> ReplicaSimulation:
    """Replay prompts over `num_replicas` engines, each with the same tier sizes and its own
    state, sharing a remote tier of `remote_bytes` (0 = none); see the module docstring.
    `routing` sends each prompt to a replica (`ROUTINGS`; `seed` for "random")."""
    if num_replicas < 1:
        raise ValueError(f"num_replicas must be >= 1, got {num_replicas}")
    if routing not in ROUTINGS:
        raise ValueError(f"routing must be one of {', '.join(ROUTINGS)}, got {routing!r}")
    config = IndexConfig(
        num_cpu_rows=cpu_rows,
        chunk_bytes=chunk_bytes,
        num_tokens_per_chunk=num_tokens_per_chunk,
        disk_capacity_bytes=disk_bytes,
        cpu_policy=policy,
        disk_policy=policy,
        admission_min_sightings=admission_min_sightings,
    )
    replicas = [
        _Replica(TierIndex(config, clock=lambda: 0.0), _EngineCache(engine_chunks))
        for _ in range(num_replicas)
    ]
    remote = SharedRemote(remote_bytes // chunk_bytes) if remote_bytes >= chunk_bytes else None
    for prompt, replica in zip(trace, _routes(num_replicas, routing, seed), strict=False):
        replicas[replica].serve(prompt, remote)
    results = tuple(
        SimulationResult(
            policy=policy,
            num_cpu_rows=cpu_rows,
            disk_capacity_bytes=disk_bytes,
            num_tokens_per_chunk=num_tokens_per_chunk,
            remote_capacity_bytes=remote_bytes,
            **{name: replica.counts[name] for name in COUNTED},
        )
        for replica in replicas
    )
    return ReplicaSimulation(routing, results)


def simulate(
    trace: Iterable[Sequence[int]],
    *,
    num_tokens_per_chunk: int,
    cpu_rows: int,
    disk_bytes: int,
    chunk_bytes: int,
    policy: str,
    engine_chunks: int = 0,
    admission_min_sightings: int = 1,
    remote_bytes: int = 0,
) -> SimulationResult:
    """Replay prompts (token-id lists) through a fresh index; `policy` is used for both tiers.

    `engine_chunks` models the engine's own prefix cache (an LRU of that many chunks, 0 = none):
    chunks it holds are neither looked up nor stored. `remote_bytes` adds a remote tier only this
    engine uses (see `simulate_replicas` for several).
    """
    return simulate_replicas(
        trace,
        num_replicas=1,
        remote_bytes=remote_bytes,
        num_tokens_per_chunk=num_tokens_per_chunk,
        cpu_rows=cpu_rows,
        disk_bytes=disk_bytes,
        chunk_bytes=chunk_bytes,
        policy=policy,
        engine_chunks=engine_chunks,
        admission_min_sightings=admission_min_sightings,
    ).replicas[0]


def sweep(
    trace: Sequence[Sequence[int]],
    *,
    num_tokens_per_chunk: int,
    cpu_rows: Sequence[int],
    disk_bytes: Sequence[int],
    chunk_bytes: int,
    policies: Sequence[str] = ("lru",),
    engine_chunks: int = 0,
) -> list[SimulationResult]:
    """`simulate` for every combination of policy, CPU rows and disk size (in that nesting)."""
    return [
        simulate(
            trace,
            num_tokens_per_chunk=num_tokens_per_chunk,
            cpu_rows=rows,
            disk_bytes=size_bytes,
            chunk_bytes=chunk_bytes,
            policy=policy,
            engine_chunks=engine_chunks,
        )
        for policy in policies
        for rows in cpu_rows
        for size_bytes in disk_bytes
    ]
