"""The replay: prompts through one `TierPipeline` per engine, over an `InlineTierService` (see the
package docstring)."""

from __future__ import annotations

import itertools
import random
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from kvstore.events import ChunkStored, TierEvent
from kvstore.hashing import chunk_keys
from kvstore.index import IndexConfig, TierIndex
from kvstore.keys import BlockKey, Tier, short_hex
from kvstore.pipeline import TierPipeline
from kvstore.policies import LRUPolicy
from kvstore.service.disk_io import DiskIO
from kvstore.service.inline import InlineTierService
from kvstore.service.inline_remote import SharedRemote
from kvstore.simulate._result import COUNTED, ReplicaSimulation, SimulationResult
from tiers.memory import MemoryStore

__all__ = ["ROUTINGS", "simulate", "simulate_replicas", "sweep"]

ROUTINGS = ("round-robin", "random")
"""How requests reach replicas: in turn, or uniformly at random (seeded)."""

# A CPU row (and the disk or remote value written from it) holds this many bytes of its chunk's
# key, whatever `chunk_bytes` is: the tiers' accounting uses `chunk_bytes`, the bytes only have
# to travel, so a load can check it got the chunk it asked for.
_ROW_BYTES = 8
_NAMESPACE = "simulate"
_WRITTEN = {Tier.DISK: "num_written_chunks", Tier.REMOTE: "num_remote_written_chunks"}


class _EngineCache:
    """The engine's own prefix cache, as an LRU of chunk keys (0 chunks: no cache)."""

    def __init__(self, num_chunks: int) -> None:
        self._num_chunks = num_chunks
        self._lru = LRUPolicy()

    def num_leading(self, keys: Sequence[BlockKey]) -> int:
        """How many of `keys`, from the first, it holds."""
        num_found = 0
        for key in keys:
            if key not in self._lru:
                break
            num_found += 1
        return num_found

    def use(self, keys: Sequence[BlockKey]) -> None:
        """The engine ran a prompt of `keys`: they are its most recent blocks."""
        if not self._num_chunks:
            return
        for key in keys:
            self._lru.insert(key)
        excess = len(self._lru) - self._num_chunks
        if excess > 0:
            self._lru.evict(excess, frozenset())


class _Rows:
    """The CPU region, `_ROW_BYTES` a row."""

    def __init__(self, num_rows: int) -> None:
        self._view = memoryview(bytearray(num_rows * _ROW_BYTES))

    def row(self, index: int) -> memoryview:
        return self._view[index * _ROW_BYTES : (index + 1) * _ROW_BYTES]


class _Tally:
    """A replica's counts, from what its pipeline reports (a `PipelineObserver`)."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()

    def record_lookup(
        self, num_chunks: int, num_tokens: int, hits_by_tier: Mapping[Tier, tuple[int, int]]
    ) -> None:
        for tier, (num_hit_chunks, _) in hits_by_tier.items():
            self.counts[f"num_{tier}_hit_chunks"] += num_hit_chunks

    def record_load_failure(self, num_chunks: int) -> None:
        raise AssertionError(f"a replay's loads never fail, got {num_chunks} failed chunks")

    def record_events(self, events: Sequence[TierEvent]) -> None:
        for event in events:
            if not isinstance(event, ChunkStored):
                self.counts[f"num_{event.tier}_evicted_chunks"] += len(event.keys)
            elif event.tier is not Tier.CPU:  # stored in CPU: counted by the replica's steps
                self.counts[_WRITTEN[event.tier]] += len(event.keys)


@dataclass
class _Replica:
    """One engine: its prefix cache, its pipeline (CPU and disk tiers) and its tallies."""

    pipeline: TierPipeline
    service: InlineTierService
    rows: _Rows
    engine: _EngineCache
    tally: _Tally
    counts: Counter[str] = field(default_factory=Counter)

    def serve(self, prompt: Sequence[int], owner: str) -> None:
        """The engine's steps for one prompt: its own cache, then the pipeline's lookup (asked
        again while pending, as vLLM asks at its next step), the load, and the store of the
        chunks it computed (written through as they land)."""
        num_tokens = self.pipeline.index.config.num_tokens_per_chunk
        keys = chunk_keys(prompt, num_tokens)
        num_engine_hits = self.engine.num_leading(keys)
        self.pipeline.record_engine_hit(keys[:num_engine_hits])
        num_cached = num_engine_hits + self._load(owner, keys[num_engine_hits:])
        self._settle()
        self._store(prompt, keys, num_cached)
        self.pipeline.forget(owner)
        self._settle()
        self.engine.use(keys)
        counts = self.counts
        counts["num_requests"] += 1
        counts["num_prompt_tokens"] += len(prompt)
        counts["num_chunks"] += len(keys)
        counts["num_engine_hit_chunks"] += num_engine_hits

    def _settle(self) -> None:
        """The I/O in flight lands (while the engine computes, in the real pipeline)."""
        while self.service.run_pending():
            self.pipeline.poll()
        self.pipeline.take_events()  # counted by the tally already

    def _load(self, owner: str, keys: Sequence[BlockKey]) -> int:
        """Look up `keys` until the answer is final, load the hits; returns how many."""
        if not keys:
            return 0
        pipeline = self.pipeline
        answer = pipeline.prepare_lookup(owner, keys)
        while answer.is_pending:
            if not self.service.run_pending():
                raise RuntimeError(f"lookup of {owner} is pending with no work queued")
            answer = pipeline.prepare_lookup(owner, keys)
        if not answer.num_hits:
            pipeline.release(owner)
            return 0
        plan = pipeline.prepare_load(owner, keys[: answer.num_hits])
        if plan.missing:  # nothing runs between a replay's lookup and its load
            raise RuntimeError(f"{len(plan.missing)} chunk(s) of {owner} vanished before loading")
        for key, row in plan.items():
            if bytes(self.rows.row(row)) != key[:_ROW_BYTES]:
                raise RuntimeError(f"chunk {short_hex(key)} loaded from row {row} with other bytes")
        pipeline.complete_load(plan.keys, ok=True)
        return answer.num_hits

    def _store(self, prompt: Sequence[int], keys: Sequence[BlockKey], num_cached: int) -> None:
        """Store the chunks after the first `num_cached` (the engine computed them)."""
        computed = keys[num_cached:]
        if not computed:
            return
        num_tokens = self.pipeline.index.config.num_tokens_per_chunk
        plan = self.pipeline.prepare_store(
            computed,
            token_ids=prompt[num_cached * num_tokens : len(keys) * num_tokens],
            parent_key=keys[num_cached - 1] if num_cached else None,
        )
        if plan is None:
            return
        for key, row in plan.items():
            self.rows.row(row)[:] = key[:_ROW_BYTES]
        self.pipeline.complete_store(plan.keys, ok=True)
        self.counts["num_stored_chunks"] += len(plan.keys)

    def result(self, sizes: SimulationResult) -> SimulationResult:
        """`sizes` with this replica's counts."""
        counts = self.counts + self.tally.counts
        counts["num_promoted_chunks"] = self.service.num_promoted_chunks
        values: dict[str, Any] = {name: counts[name] for name in COUNTED}
        return replace(sizes, **values)


def _replica(config: IndexConfig, engine_chunks: int, remote: SharedRemote | None) -> _Replica:
    rows = _Rows(config.num_cpu_rows)
    disk = None
    if config.has_disk:
        store = MemoryStore(capacity_bytes=config.num_disk_chunks * _ROW_BYTES)
        store.register_namespace(_NAMESPACE, {"kvstore": "simulate"})
        disk = DiskIO(store, _NAMESPACE, rows, clock=lambda: 0.0)
    service = InlineTierService(disk, remote=remote, remote_rows=rows, is_recording=False)
    tally = _Tally()
    pipeline = TierPipeline(
        TierIndex(config, clock=lambda: 0.0),
        service,
        [tally],
        num_tokens_per_chunk=config.num_tokens_per_chunk,
    )
    return _Replica(pipeline, service, rows, _EngineCache(engine_chunks), tally)


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
    remote = SharedRemote(remote_bytes // chunk_bytes) if remote_bytes >= chunk_bytes else None
    replicas = [_replica(config, engine_chunks, remote) for _ in range(num_replicas)]
    routes = _routes(num_replicas, routing, seed)
    for number, (prompt, replica) in enumerate(zip(trace, routes, strict=False)):
        replicas[replica].serve(prompt, f"r{number}")
    sizes = SimulationResult(policy, cpu_rows, disk_bytes, num_tokens_per_chunk, remote_bytes)
    return ReplicaSimulation(routing, tuple(replica.result(sizes) for replica in replicas))


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
    """Replay prompts (token-id lists) through a fresh pipeline; `policy` is used for both tiers.

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
