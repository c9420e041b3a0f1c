"""One engine of `kvstore bench nohit`, in a process of its own, driven over stdin/stdout.

    python -m kvstore.bench.nohit_engine MODEL_DIR LAYOUT VARIANT NUM_TOKENS KV_TOKENS WORKDIR

Each engine lives in its own process so that an in-process engine (`LAYOUT=inproc`) has that
process to itself, and so that engines of every variant stay up together and the benchmark can
interleave them. Requests, one JSON line each: `{"seeds": [...], "max_tokens": N}` runs a
batch of those unique prompts and answers `{"seconds", "engine_cpu_s", "writer_cpu_s",
"stored", "dropped", "hit_tokens"}` once each of the batch's chunks was written to disk or
dropped (CPU time includes those writes);
end of input ends it. It prints `{"ready": true}` after a warm-up batch.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kvstore.bench.engines import BENCH_SPEC, BenchEngine, bench_engine, synthetic_prompt
from kvstore.bench.proc_cpu import tree_cpu

__all__ = ["VARIANTS", "kvstore_config", "main"]

VARIANTS: dict[str, str] = {
    "none": "no KV connector",
    "null": "NullConnector (a connector that moves nothing)",
    "kvstore_cpu": "kvstore, CPU tier only",
    "kvstore_thread": "kvstore, disk tier, LMDB writes on an engine thread (disk_writer: thread)",
    "kvstore": "kvstore, disk tier, LMDB writes in its idle-priority process (the default)",
    "kvstore_admit2": "kvstore as shipped, but a chunk goes to disk only once seen twice "
    "(admission_min_sightings: 2)",
}


def kvstore_config(variant: str, workdir: Path, num_tokens: int) -> dict[str, Any] | None:
    """The connector config of `variant` (None: not kvstore)."""
    if not variant.startswith("kvstore"):
        return None
    config: dict[str, Any] = {"cpu_bytes": 8 * num_tokens * BENCH_SPEC.kv_bytes_per_token}
    if variant != "kvstore_cpu":
        config["disk_path"] = str(workdir / f"store-{variant}")
        config["disk_bytes"] = 4 << 30
        config["disk_writer"] = "thread" if variant == "kvstore_thread" else "process"
    if variant == "kvstore_admit2":
        config["admission_min_sightings"] = 2
    return config


_BLOCK_TOKENS = 32  # bench_engine's block size, kvstore's chunk


def _written(engine: BenchEngine) -> tuple[float, float]:
    """(chunks written to disk, write-throughs dropped) so far.

    Written chunks are counted from the bytes the writer committed, which its I/O thread
    reports as each write completes; `kvstore_stored_chunks_total{tier="disk"}` counts them
    when the scheduler half takes the completion, at the engine's next step, which an idle
    engine never takes."""
    if engine.metrics_url is None:
        return 0.0, 0.0
    samples = engine.metrics()
    written = samples.get(("kvstore_transfer_bytes_total", (("direction", "cpu_to_disk"),)), 0.0)
    stored = written / (_BLOCK_TOKENS * BENCH_SPEC.kv_bytes_per_token)
    dropped = sum(
        value
        for (name, labels), value in samples.items()
        if name == "kvstore_queue_dropped_total" and ("queue", "write_through") in labels
    )
    return stored, dropped


def _wait_written(engine: BenchEngine, before: tuple[float, float], num_chunks: int) -> None:
    """Until every chunk of the batch was written or dropped, and the writes settled."""
    deadline = time.monotonic() + 120
    while engine.metrics_url is not None and time.monotonic() < deadline:
        stored, dropped = _written(engine)
        if stored + dropped - sum(before) >= num_chunks:
            engine.wait_settled()
            return
        time.sleep(0.05)


def _serve(engine: BenchEngine, num_tokens: int, has_disk: bool) -> None:
    engine.batch_s([synthetic_prompt(7, num_tokens)], 4)
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        prompts = [synthetic_prompt(seed, num_tokens) for seed in request["seeds"]]
        written, before = _written(engine), tree_cpu(os.getpid())
        seconds = engine.batch_s(prompts, int(request["max_tokens"]))
        if has_disk:
            _wait_written(engine, written, len(prompts) * (num_tokens // _BLOCK_TOKENS))
        used = tree_cpu(os.getpid()) - before
        stored, dropped = _written(engine)
        answer = {
            "seconds": seconds,
            "engine_cpu_s": used.engine_s,
            "writer_cpu_s": used.writer_s,
            "stored": stored - written[0],
            "dropped": dropped - written[1],
            "hit_tokens": sum(engine.hit_tokens()) if engine.metrics_url else 0.0,
        }
        print(json.dumps(answer), flush=True)


def main(argv: Sequence[str]) -> int:
    model, layout, variant, num_tokens, kv_tokens, workdir = argv[1:7]
    config = kvstore_config(variant, Path(workdir), int(num_tokens))
    with bench_engine(
        Path(model),
        int(num_tokens),
        kv_cache_tokens=int(kv_tokens),
        kvstore=config,
        multiprocess=layout == "multiproc",
        has_connector=variant != "none",
    ) as engine:
        # a chunk seen once is not admitted to disk: no write to wait for
        writes = config is not None and "disk_path" in config and variant != "kvstore_admit2"
        _serve(engine, int(num_tokens), has_disk=writes)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
