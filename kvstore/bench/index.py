"""Benchmark of the tier index's step path (not a timed test).

    kvstore bench index [--sizes 10000 100000 1000000] [--policies lru arc]
                                               [--batch 16] [--num-batches 2000]

For each population N and policy: a CPU tier of N rows and a disk tier of N chunks, both full, so
every store evicts from CPU and every write-through evicts from disk. Each step, in the
connector's order: an older batch is looked up and its load prepared (lookup, prepare_load), a
batch of new keys is stored (prepare_store, complete_store) and written through
(plan/complete_write_through), and the load completes (complete_load). Looked-up batches are drawn
at random from those the CPU tier still holds, so every lookup is a full hit.

Every call is timed on its own; the table shows microseconds per chunk over the batches: median,
mean, mean of the calls up to p99 (on a shared machine the top 1% are mostly the process being
preempted for a 4 ms time slice), and p99. Flat across N means no O(N) work on the step path.
Python's garbage collector is left on, as in the engine.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from kvstore.events import ChunkRemoved, TierEvent
from kvstore.index import IndexConfig, SeedEntry, TierIndex
from kvstore.keys import BlockKey, Tier

CHUNK_BYTES = 1 << 20
OPS = (
    "lookup",
    "prepare_store",
    "complete_store",
    "prepare_load",
    "complete_load",
    "plan_write_through",
    "complete_write_through",
)


@dataclass
class Timings:
    ns_per_chunk: dict[str, list[float]] = field(default_factory=lambda: {op: [] for op in OPS})

    def timed(self, op: str, num_chunks: int, call: Callable[[], object]) -> object:
        start_ns = time.perf_counter_ns()
        result = call()
        self.ns_per_chunk[op].append((time.perf_counter_ns() - start_ns) / max(1, num_chunks))
        return result


def new_keys(rng: random.Random, n: int) -> list[BlockKey]:
    return [BlockKey(rng.randbytes(32)) for _ in range(n)]


def build(
    num_entries: int, policy: str, rng: random.Random
) -> tuple[TierIndex, list[list[BlockKey]]]:
    """A full index: N ready CPU chunks (also the lookup pool) and N other chunks on disk."""
    config = IndexConfig(
        num_cpu_rows=num_entries,
        chunk_bytes=CHUNK_BYTES,
        num_tokens_per_chunk=16,
        disk_capacity_bytes=num_entries * CHUNK_BYTES,
        cpu_policy=policy,
        disk_policy=policy,
    )
    index = TierIndex(config)
    index.seed_disk(
        SeedEntry(key, CHUNK_BYTES, float(i)) for i, key in enumerate(new_keys(rng, num_entries))
    )
    batches: list[list[BlockKey]] = []
    for start in range(0, num_entries, 1024):
        keys = new_keys(rng, min(1024, num_entries - start))
        plan = index.prepare_store(keys)
        assert plan is not None and plan.num_skipped == 0
        index.complete_store(plan.keys, success=True)
        batches.extend(keys[i : i + 16] for i in range(0, len(keys), 16))
    write = index.plan_write_through()  # the fill is not what is timed: undo its writes
    index.complete_write_through(write.keys, False)
    index.take_events()
    return index, batches


class Pool:
    """The stored batches, and which of them the CPU tier still holds entirely."""

    def __init__(self, batches: list[list[BlockKey]], rng: random.Random) -> None:
        self.batches = batches
        self.batch_of = {key: i for i, keys in enumerate(batches) for key in keys}
        self.dead: set[int] = set()
        self.rng = rng

    def add(self, keys: list[BlockKey]) -> None:
        self.batch_of.update(dict.fromkeys(keys, len(self.batches)))
        self.batches.append(keys)

    def forget(self, events: list[TierEvent]) -> None:
        for event in events:
            if isinstance(event, ChunkRemoved) and event.tier is Tier.CPU:
                self.dead.update(self.batch_of.pop(key) for key in event.keys)

    def pick_live(self) -> list[BlockKey]:
        while True:
            i = self.rng.randrange(len(self.batches))
            if i not in self.dead:
                return self.batches[i]


def step(index: TierIndex, timings: Timings, keys: list[BlockKey], old: list[BlockKey]) -> None:
    """One scheduler step's worth of index calls."""
    n = len(keys)
    found = timings.timed("lookup", len(old), lambda: index.lookup(old))
    assert found.num_hits == len(old)  # type: ignore[attr-defined]
    timings.timed("prepare_load", len(old), lambda: index.prepare_load(old))
    plan = timings.timed("prepare_store", n, lambda: index.prepare_store(keys))
    assert plan is not None
    timings.timed("complete_store", n, lambda: index.complete_store(keys, success=True))
    write = timings.timed("plan_write_through", n, index.plan_write_through)
    timings.timed("complete_load", len(old), lambda: index.complete_load(old))
    done = write.keys  # type: ignore[attr-defined]
    timings.timed("complete_write_through", n, lambda: index.complete_write_through(done, True))


def run(num_entries: int, policy: str, batch: int, num_batches: int, seed: int) -> Timings:
    rng = random.Random(seed)
    index, batches = build(num_entries, policy, rng)
    pool = Pool([keys[:batch] for keys in batches], rng)
    timings = Timings()
    for _ in range(num_batches):
        keys = new_keys(rng, batch)
        step(index, timings, keys, pool.pick_live())
        pool.add(keys)
        pool.forget(index.take_events())
    index.check_invariants()
    return timings


def summarize(values_ns: Sequence[float]) -> tuple[float, float, float, float]:
    """p50, mean, mean of the calls up to p99 (drops preemptions by other processes), p99; in µs."""
    ordered = sorted(values_ns)
    num_kept = max(1, int(0.99 * len(ordered)))
    p99 = ordered[num_kept - 1]
    return (
        statistics.median(ordered) / 1e3,
        statistics.fmean(ordered) / 1e3,
        statistics.fmean(ordered[:num_kept]) / 1e3,
        p99 / 1e3,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    parser.add_argument("--policies", nargs="+", default=["lru", "arc"])
    parser.add_argument("--batch", type=int, default=16, help="chunks per call")
    parser.add_argument("--num-batches", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    rows: list[tuple[str, str, int, float, float, float, float]] = []
    for policy in args.policies:
        for num_entries in args.sizes:
            start_s = time.perf_counter()
            timings = run(num_entries, policy, args.batch, args.num_batches, args.seed)
            print(f"{policy} N={num_entries:,}: {time.perf_counter() - start_s:.1f} s")
            for op in OPS:
                rows.append((op, policy, num_entries, *summarize(timings.ns_per_chunk[op])))

    print()
    print(f"µs per chunk, batches of {args.batch}, {args.num_batches} batches per row")
    header = ("operation", "policy", "entries", "p50", "mean", "mean<p99", "p99")
    print(f"{header[0]:<24}{header[1]:<8}" + "".join(f"{h:>10}" for h in header[2:]))
    for op in OPS:
        for name, policy, num_entries, *values_us in rows:
            if name == op:
                numbers = "".join(f"{value:>10.2f}" for value in values_us)
                print(f"{op:<24}{policy:<8}{num_entries:>10,}{numbers}")


if __name__ == "__main__":
    main()
