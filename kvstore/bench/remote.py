"""The remote tier against its baselines, in one run.

    kvstore bench remote [--url redis://127.0.0.1:6379/0] [--tokens 2048] [--repeats 5]
                         [--layout multiproc|inproc] [--reserved-cpus 1] [--fixed-malloc]

1. Reads: `RemoteChunks.load_into` (pipelined per node, header and xxh64 verified, copied into
   row buffers) vs raw redis-py GETs of the same values, one after another, from Python.
2. Time to first token of a prompt another replica computed: engine A (kvstore, remote tier)
   prefills it and writes it through to Redis; engine B (kvstore, same Redis, nothing local)
   serves it from Redis. Against recompute and the engine's own prefix hit (the floor) on an
   engine without kvstore, interleaved.
3. Whether the local disk should keep a copy of remote hits: B also has a disk tier (as a
   replica with NVMe would), so each remote hit is written through to it; once other prompts
   have pushed the prompts out of B's CPU tier, each is asked again and served from that copy.
4. A distant Redis (`load_policy: cost`): engine C reaches the same Redis through a loopback
   proxy that adds latency and limits bandwidth (`--slow-latency-ms`, `--slow-mbps`); after a
   few prompts of its own (what it measures), it is asked for the prompts A stored. It loads
   only what beats recomputing; its time to first token is compared with the recompute of an
   engine without kvstore started beside it and timed in turn with it (the same prompts).

Without `--url` a throwaway `redis-server` (Debian's package) is started on a free port.
Engines run in vLLM's default multiprocess layout, or in-process (`--layout inproc`: each in a
host process of its own, `kvstore.bench.hosted`); all get the same core reservation
(`VLLM_CPU_NUM_OF_RESERVED_CPU`, `--reserved-cpus`), and the baseline has no connector.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from kvstore.bench.engines import BENCH_SPEC, BenchEngine, bench_engine, free_port, synthetic_prompt
from kvstore.bench.malloc import add_fixed_malloc_argument, apply_fixed_malloc
from kvstore.bench.slow_link import SlowLink
from kvstore.keys import BlockKey
from kvstore.namespace import NamespaceDescriptor
from kvstore.remote import RemoteChunks, RemoteConfig, RemoteStore
from kvstore.remote.codec import descriptor_key
from kvstore.tiny_model import build_tiny_llama

__all__ = ["main"]

_BLOCK_TOKENS = 32
_TARGET_VS_RECOMPUTE = 0.3


@contextlib.contextmanager
def _redis(url: str | None) -> Iterator[str]:
    if url is not None:
        yield url
        return
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="kvstore-bench-redis-") as tmp:
        server = subprocess.Popen(
            ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", tmp],
            stdout=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            time.sleep(0.5)
            yield f"redis://127.0.0.1:{port}/0"
        finally:
            server.terminate()
            server.wait(10)


# -- 1. reads ---------------------------------------------------------------------------------


async def _reads(
    url: str, num_values: int, value_bytes: int, rounds: int
) -> dict[str, list[float]]:
    import redis
    import redis.asyncio as aioredis

    config = RemoteConfig.from_values({"remote_url": url, "remote_timeout_ms": 10_000})
    assert config is not None
    store = RemoteStore(config)
    await store.connect()
    chunks = RemoteChunks(store, _descriptor(value_bytes))  # knows its value size, as an engine's
    keys = [BlockKey(i.to_bytes(32, "big")) for i in range(num_values)]
    await chunks.store_many([(key, bytes([i % 251]) * value_bytes) for i, key in enumerate(keys)])
    raw = aioredis.Redis.from_url(url)
    blocking = redis.Redis.from_url(url, socket_read_size=1 << 20)
    outs = [memoryview(bytearray(value_bytes)) for _ in keys]
    redis_keys = [chunks.redis_key(key) for key in keys]
    times: dict[str, list[float]] = {"raw_get": [], "raw_get_blocking": [], "kvstore_load_into": []}
    try:
        for _ in range(rounds):
            start = time.perf_counter()
            for redis_key in redis_keys:
                await raw.get(redis_key)
            times["raw_get"].append(time.perf_counter() - start)
            start = time.perf_counter()
            for redis_key in redis_keys:
                blocking.get(redis_key)
            times["raw_get_blocking"].append(time.perf_counter() - start)
            start = time.perf_counter()
            loaded = await chunks.load_into(keys, outs)
            times["kvstore_load_into"].append(time.perf_counter() - start)
            if not all(loaded):
                raise RuntimeError("the remote tier lost values during the benchmark")
        await chunks.remove(keys)
        await store.delete_many([descriptor_key(chunks.namespace_id)])
    finally:
        blocking.close()
        await raw.aclose()
        await store.close()
    return times


def _descriptor(row_bytes: int) -> NamespaceDescriptor:
    return NamespaceDescriptor(
        model="kvstore-bench-remote-reads",
        kv_dtype="bfloat16",
        engine_block_size=_BLOCK_TOKENS,
        blocks_per_chunk=1,
        tp_size=1,
        device_type="cpu",
        attention_backend="bench",
        hash_algo="sha256",
        row_bytes=row_bytes,
        layout={},
    )


# -- 2. time to first token ---------------------------------------------------------------------


def _remote_bytes(engine: BenchEngine) -> float:
    """Bytes the engine's writes put in Redis so far: counted by its I/O thread as each write
    lands (`kvstore_stored_chunks_total` is counted when the scheduler applies the write, at
    the engine's next step, which an idle engine does not take)."""
    return engine.metric("kvstore_transfer_bytes_total", direction="cpu_to_remote")


def _wait_remote_stored(engine: BenchEngine, at_least: float, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while _remote_bytes(engine) < at_least:
        if time.monotonic() > deadline:
            raise TimeoutError("the prompt did not reach the remote tier in time")
        time.sleep(0.1)


@dataclass(frozen=True)
class _Link:
    latency_s: float
    bytes_per_s: float


def _ttft(
    model: Path, url: str, num_tokens: int, repeats: int, workdir: Path, slow: _Link,
    hosted: bool,
) -> tuple[dict[str, list[float]], dict[str, dict[str, float]]]:  # fmt: skip
    prompt_bytes = num_tokens * BENCH_SPEC.kv_bytes_per_token
    chunks = (num_tokens - 1) // _BLOCK_TOKENS
    cpu_bytes = 2 * prompt_bytes + (8 << 20)
    num_fillers = _num_fillers(cpu_bytes, num_tokens)
    writer = {"cpu_bytes": cpu_bytes, "remote_url": url, "remote_queue_chunks": 4 * chunks}
    reader = {"cpu_bytes": cpu_bytes, "remote_url": url, "remote_write": False,
              "disk_path": str(workdir / "reader-store"),
              "disk_bytes": 2 * (repeats + num_fillers + 2) * prompt_bytes,
              "disk_queue_chunks": 4 * chunks}  # fmt: skip
    times: dict[str, list[float]] = {"recompute": [], "engine_cache": [], "kvstore_remote": []}
    prompts = [synthetic_prompt(500 + r, num_tokens) for r in range(repeats)]
    with (
        bench_engine(model, num_tokens, has_connector=False, hosted=hosted) as off,
        bench_engine(model, num_tokens, kvstore=writer, hosted=hosted) as a,
        bench_engine(model, num_tokens, kvstore=reader, hosted=hosted) as b,
    ):
        for engine, seed in ((off, 1), (a, 2), (b, 3)):
            engine.ttft_s(synthetic_prompt(seed, num_tokens))  # one-off costs of a new engine
        for prompt in prompts:
            times["recompute"].append(off.ttft_s(prompt))
            times["engine_cache"].append(off.ttft_s(prompt))
            off.reset_prefix_cache()
            stored = _remote_bytes(a)
            a.ttft_s(prompt)  # replica A computes it and writes it through to Redis
            _wait_remote_stored(a, stored + chunks * _BLOCK_TOKENS * BENCH_SPEC.kv_bytes_per_token)
            with b.expect_hits("remote", chunks * _BLOCK_TOKENS):
                times["kvstore_remote"].append(b.ttft_s(prompt))  # replica B: a remote hit
            b.wait_settled()
        times["kvstore_disk_copy"] = _disk_copy_hits(b, prompts, chunks, num_fillers)
    times["recompute_beside_slow_link"], times["kvstore_remote_slow_link"] = [], []
    with (
        SlowLink(url.split("//")[1].split("/", maxsplit=1)[0], latency_s=slow.latency_s,
                 bytes_per_s=slow.bytes_per_s) as link,
        bench_engine(model, num_tokens, has_connector=False, hosted=hosted) as off2,
        bench_engine(model, num_tokens, kvstore={"cpu_bytes": cpu_bytes, "remote_url": link.url,
                     "remote_write": False, "remote_timeout_ms": 60_000}, hosted=hosted) as c,
    ):  # fmt: skip
        off2.ttft_s(synthetic_prompt(4, num_tokens))
        for k in range(4):  # prompts of its own: C measures its prefill and the link's latency
            c.ttft_s(synthetic_prompt(700 + k, num_tokens))
        decisions = {"warm-up": _decisions_since(c, {})}
        for r, prompt in enumerate(prompts):  # paired with an engine without kvstore, now
            pair = [("recompute_beside_slow_link", off2), ("kvstore_remote_slow_link", c)]
            before = _decisions_since(c, {})
            for name, engine in pair if r % 2 else pair[::-1]:
                times[name].append(engine.ttft_s(prompt))
            decisions[f"prompt {r + 1}"] = _decisions_since(c, before)
    return times, decisions


def _decisions_since(engine: BenchEngine, before: dict[str, float]) -> dict[str, float]:
    """Engine's remote `load_policy` decisions (load, recompute, gave_up) since `before`."""
    return {
        decision: engine.metric("kvstore_load_decisions_total", tier="remote", decision=decision)
        - before.get(decision, 0.0)
        for decision in ("load", "recompute", "gave_up")
    }


def _describe(decisions: dict[str, float]) -> str:
    made = [f"{name} {count:.0f}" for name, count in decisions.items() if count]
    return ", ".join(made) or "none"


def _num_fillers(cpu_bytes: int, num_tokens: int) -> int:
    """Prompts to store after the measured ones so that none of their chunks is left in B's CPU
    tier: together they hold more chunks than the tier has rows (LRU evicts the oldest)."""
    chunk_bytes = _BLOCK_TOKENS * BENCH_SPEC.kv_bytes_per_token
    return cpu_bytes // chunk_bytes // (num_tokens // _BLOCK_TOKENS) + 1


def _disk_copy_hits(
    b: BenchEngine, prompts: Sequence[Sequence[int]], chunks: int, num_fillers: int
) -> list[float]:
    """Push `prompts` out of B's CPU tier, then time each again: served from B's disk copy
    alone (a hit that also took chunks from the CPU tier or Redis would time something else)."""
    num_tokens = len(prompts[0])
    for k in range(num_fillers):
        b.ttft_s(synthetic_prompt(900 + k, num_tokens))
        b.wait_settled()
    times = []
    for prompt in prompts:
        b.reset_prefix_cache()
        with b.expect_hits("disk", chunks * _BLOCK_TOKENS, is_sole_tier=True):
            times.append(b.ttft_s(prompt))
        b.wait_settled()
    return times


def _median_row(name: str, values: Sequence[float], base: float) -> str:
    median = statistics.median(values)
    return (f"| {name} | {median:.3f} | {min(values):.3f}-{max(values):.3f} | "
            f"{median / base:.2f} |")  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="kvstore bench remote", description=__doc__)
    parser.add_argument("--url", help="a Redis to use (default: start a throwaway one)")
    parser.add_argument("--tokens", type=int, default=2048)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--skip-ttft", action="store_true")
    parser.add_argument(
        "--slow-latency-ms",
        type=float,
        default=50.0,
        help="the distant Redis's added latency, each way (default 50)",
    )
    parser.add_argument(
        "--slow-mbps",
        type=float,
        default=4.0,
        help="the distant Redis's bandwidth, MB/s each way (default 4)",
    )
    parser.add_argument("--layout", choices=["multiproc", "inproc"], default="multiproc")
    parser.add_argument("--reserved-cpus", type=int, default=1,
                        help="VLLM_CPU_NUM_OF_RESERVED_CPU of every engine")  # fmt: skip
    add_fixed_malloc_argument(parser)
    args = parser.parse_args(argv)
    os.environ["VLLM_CPU_NUM_OF_RESERVED_CPU"] = str(args.reserved_cpus)
    malloc = apply_fixed_malloc(args.fixed_malloc, os.environ)
    value_bytes = _BLOCK_TOKENS * BENCH_SPEC.kv_bytes_per_token
    num_values = (args.tokens - 1) // _BLOCK_TOKENS
    with _redis(args.url) as url:
        reads = asyncio.run(_reads(url, num_values, value_bytes, args.repeats))
        raw = statistics.median(reads["raw_get"])
        blocking = statistics.median(reads["raw_get_blocking"])
        ours = statistics.median(reads["kvstore_load_into"])
        print(f"reads: {num_values} values of {value_bytes >> 10} KiB; raw sequential GETs "
              f"{raw * 1e3:.1f} ms (asyncio client), {blocking * 1e3:.1f} ms (blocking client); "
              f"load_into {ours * 1e3:.1f} ms (verified, copied into rows): {raw / ours:.2f}x "
              f"the asyncio GETs' speed, {blocking / ours:.2f}x the blocking ones'")  # fmt: skip
        if args.skip_ttft:
            return 0
        with tempfile.TemporaryDirectory(prefix="kvstore-bench-") as tmp:
            model = build_tiny_llama(Path(tmp) / "model", BENCH_SPEC)
            slow = _Link(args.slow_latency_ms / 1e3, args.slow_mbps * 1e6)
            times, decisions = _ttft(model, url, args.tokens, args.repeats, Path(tmp), slow,
                                     hosted=args.layout == "inproc")  # fmt: skip
    base = statistics.median(times["recompute"])
    print(f"\nprompt {args.tokens} tokens, {args.repeats} interleaved repeats, {args.layout} "
          f"layout, {os.cpu_count()} cores, VLLM_CPU_NUM_OF_RESERVED_CPU={args.reserved_cpus} "
          f"for every engine, {malloc}")  # fmt: skip
    print("| path | TTFT median s | min-max s | vs recompute |\n|---|--:|--:|--:|")
    for name, values in times.items():
        print(_median_row(name, values, base))
    ratio = statistics.median(times["kvstore_remote"]) / base
    verdict = "met" if ratio <= _TARGET_VS_RECOMPUTE else "MISSED"
    print(f"- kvstore_remote <= {_TARGET_VS_RECOMPUTE}x recompute: {ratio:.2f} ({verdict})")
    remote = statistics.median(times["kvstore_remote"])
    copy = statistics.median(times["kvstore_disk_copy"])
    print(f"- a hit on the local disk's copy of remote hits: {copy / remote:.2f}x a remote hit")
    far = statistics.median(times["kvstore_remote_slow_link"]) / statistics.median(
        times["recompute_beside_slow_link"]
    )  # the baseline measured beside engine C, interleaved
    per_prompt = [
        kv / rc
        for kv, rc in zip(
            times["kvstore_remote_slow_link"], times["recompute_beside_slow_link"], strict=True
        )
    ]
    print(f"- Redis behind {args.slow_latency_ms:g} ms and {args.slow_mbps:g} MB/s: "
          f"{far:.2f}x the recompute of an engine without kvstore run beside it "
          "(target <= 1.1); per prompt, paired, with the engine's remote load_policy "
          "decisions during it:")  # fmt: skip
    print(f"  - warm-up (4 prompts not in Redis): {_describe(decisions['warm-up'])}")
    for r, ratio in enumerate(per_prompt):
        print(f"  - prompt {r + 1}: {ratio:.2f}x ({_describe(decisions[f'prompt {r + 1}'])})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
