"""Replay prompt traces through the real `TierIndex` to size tiers and compare policies.

Pure: no I/O besides `load_trace`, no vLLM. Each prompt goes through the index the way the
connector drives it: lookup (after the engine's own prefix cache, when modelled) → promote the
disk hits (completing at once) → load → store the chunks the engine computed → write them through.
"""

from __future__ import annotations

import json
from collections import Counter, OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from kvstore.errors import KVStoreError
from kvstore.events import ChunkRemoved
from kvstore.hashing import chunk_keys
from kvstore.index import IndexConfig, TierIndex
from kvstore.keys import BlockKey, Tier

__all__ = [
    "SimulationResult",
    "TraceFormatError",
    "chunk_keys",
    "load_trace",
    "simulate",
    "sweep",
]


class TraceFormatError(KVStoreError, ValueError):
    """A trace file line is not `{"prompt_token_ids": [int, ...]}`."""


@dataclass(frozen=True, slots=True)
class SimulationResult:
    """Hit counts of one replay, in chunks; `*_tokens` properties multiply by the chunk size."""

    policy: str
    num_cpu_rows: int
    disk_capacity_bytes: int
    num_tokens_per_chunk: int
    num_requests: int = 0
    num_prompt_tokens: int = 0
    num_chunks: int = 0
    num_engine_hit_chunks: int = 0
    num_cpu_hit_chunks: int = 0
    num_disk_hit_chunks: int = 0
    num_promoted_chunks: int = 0
    num_stored_chunks: int = 0
    num_written_chunks: int = 0
    num_cpu_evicted_chunks: int = 0
    num_disk_evicted_chunks: int = 0

    @property
    def num_hit_chunks(self) -> int:
        """Chunks served from the offload tiers (CPU or disk), not counting the engine's own."""
        return self.num_cpu_hit_chunks + self.num_disk_hit_chunks

    @property
    def num_miss_chunks(self) -> int:
        """Full chunks the engine had to compute."""
        return self.num_chunks - self.num_engine_hit_chunks - self.num_hit_chunks

    @property
    def num_cpu_hit_tokens(self) -> int:
        return self.num_cpu_hit_chunks * self.num_tokens_per_chunk

    @property
    def num_disk_hit_tokens(self) -> int:
        return self.num_disk_hit_chunks * self.num_tokens_per_chunk

    @property
    def num_hit_tokens(self) -> int:
        return self.num_hit_chunks * self.num_tokens_per_chunk

    @property
    def hit_ratio(self) -> float:
        """Offload-tier hits over the chunks the engine did not have (0 when there were none)."""
        num_asked = self.num_chunks - self.num_engine_hit_chunks
        return self.num_hit_chunks / num_asked if num_asked else 0.0

    def as_row(self) -> dict[str, int | float | str]:
        """A flat dict for tables and JSON, derived counts included."""
        row: dict[str, int | float | str] = asdict(self)
        row.update(
            num_hit_chunks=self.num_hit_chunks,
            num_miss_chunks=self.num_miss_chunks,
            num_cpu_hit_tokens=self.num_cpu_hit_tokens,
            num_disk_hit_tokens=self.num_disk_hit_tokens,
            hit_ratio=round(self.hit_ratio, 6),
        )
        return row


class _EngineCache:
    """The engine's own prefix cache, as an LRU of chunk keys."""

    def __init__(self, num_chunks: int) -> None:
        self._num_chunks = num_chunks
        self._keys: OrderedDict[BlockKey, None] = OrderedDict()

    def num_prefix_hits(self, keys: Sequence[BlockKey]) -> int:
        num_hits = 0
        for key in keys:
            if key not in self._keys:
                break
            num_hits += 1
        return num_hits

    def use(self, keys: Sequence[BlockKey]) -> None:
        if self._num_chunks == 0:
            return
        for key in keys:
            self._keys[key] = None
            self._keys.move_to_end(key)
        while len(self._keys) > self._num_chunks:
            self._keys.popitem(last=False)


# The counts `simulate` tallies (every int field of SimulationResult but the configuration).
_COUNTED = (
    "num_requests",
    "num_prompt_tokens",
    "num_chunks",
    "num_engine_hit_chunks",
    "num_cpu_hit_chunks",
    "num_disk_hit_chunks",
    "num_promoted_chunks",
    "num_stored_chunks",
    "num_written_chunks",
    "num_cpu_evicted_chunks",
    "num_disk_evicted_chunks",
)


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
) -> None:
    """Store the chunks after the first `num_cached` (the engine computed them), write through."""
    num_tokens = index.config.num_tokens_per_chunk
    computed = keys[num_cached:]
    if computed:
        plan = index.prepare_store(
            computed,
            token_ids=prompt[num_cached * num_tokens : len(keys) * num_tokens],
            parent_key=keys[num_cached - 1] if num_cached else None,
        )
        if plan is not None:
            index.complete_store(plan.keys, success=True)
            counts["num_stored_chunks"] += len(plan.keys)
    write = index.plan_write_through(index.take_write_through_candidates())
    index.complete_write_through(write.keys, success=True)
    counts["num_written_chunks"] += len(write.keys)


def _count_evictions(index: TierIndex, counts: Counter[str]) -> None:
    for event in index.take_events():
        if isinstance(event, ChunkRemoved):
            name = "num_cpu_evicted_chunks" if event.tier is Tier.CPU else "num_disk_evicted_chunks"
            counts[name] += len(event.keys)


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
) -> SimulationResult:
    """Replay prompts (token-id lists) through a fresh index; `policy` is used for both tiers.

    `engine_chunks` models the engine's own prefix cache (an LRU of that many chunks, 0 = none):
    chunks it holds are neither looked up nor stored.
    """
    config = IndexConfig(
        num_cpu_rows=cpu_rows,
        chunk_bytes=chunk_bytes,
        num_tokens_per_chunk=num_tokens_per_chunk,
        disk_capacity_bytes=disk_bytes,
        cpu_policy=policy,
        disk_policy=policy,
        admission_min_sightings=admission_min_sightings,
    )
    counts = _replay(trace, TierIndex(config, clock=lambda: 0.0), engine_chunks)
    return SimulationResult(
        policy=policy,
        num_cpu_rows=cpu_rows,
        disk_capacity_bytes=disk_bytes,
        num_tokens_per_chunk=num_tokens_per_chunk,
        **{name: counts[name] for name in _COUNTED},
    )


def _replay(trace: Iterable[Sequence[int]], index: TierIndex, engine_chunks: int) -> Counter[str]:
    num_tokens_per_chunk = index.config.num_tokens_per_chunk
    engine = _EngineCache(engine_chunks)
    counts: Counter[str] = Counter()
    for prompt in trace:
        keys = chunk_keys(prompt, num_tokens_per_chunk)
        num_engine_hits = engine.num_prefix_hits(keys)
        num_hits = _serve(index, keys[num_engine_hits:], counts)
        _store(index, prompt, keys, num_engine_hits + num_hits, counts)
        _count_evictions(index, counts)
        engine.use(keys)
        counts["num_requests"] += 1
        counts["num_prompt_tokens"] += len(prompt)
        counts["num_chunks"] += len(keys)
        counts["num_engine_hit_chunks"] += num_engine_hits
    return counts


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


def load_trace(path: str | Path) -> list[list[int]]:
    """Prompts from JSONL, one `{"prompt_token_ids": [...]}` per line (blank lines skipped)."""
    prompts: list[list[int]] = []
    with Path(path).open("rb") as lines:
        for line_number, raw in enumerate(lines, start=1):
            where = f"{path}:{line_number}"
            try:
                line = raw.decode()
            except UnicodeDecodeError as exc:
                raise TraceFormatError(f"{where}: not UTF-8 ({exc.reason})") from exc
            if line.strip():
                prompts.append(_parse_line(line, where))
    return prompts


def _parse_line(line: str, where: str) -> list[int]:
    try:
        record = json.loads(line)
    except json.JSONDecodeError as exc:
        raise TraceFormatError(f"{where}: not JSON ({exc.msg})") from exc
    except (ValueError, RecursionError) as exc:  # an int of > 4300 digits, too deep nesting
        raise TraceFormatError(f"{where}: not a trace record ({str(exc)[:80]})") from exc
    token_ids = record.get("prompt_token_ids") if isinstance(record, dict) else None
    if not isinstance(token_ids, list):
        raise TraceFormatError(
            f'{where}: expected an object with "prompt_token_ids": [int, ...], '
            f"got {line.strip()[:80]!r}"
        )
    if not all(isinstance(token, int) and not isinstance(token, bool) for token in token_ids):
        raise TraceFormatError(f"{where}: prompt_token_ids must all be integers")
    return token_ids
