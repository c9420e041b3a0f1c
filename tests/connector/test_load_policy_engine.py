"""`load_policy: cost` on the real engine, with Redis behind a slow link the test starts.

One engine fills a real Redis; a fresh engine then asks for the same prompts after a few
unrelated requests (its measurements: step times, probe round trips, write-throughs). Behind a
link with 60 ms of latency each way, kvstore decides against Redis before the request waits on
it (no hit, decisions counted as "recompute"); with `load_policy: always` the same engine loads
through the same link (so the chunks were there and the link works); on the direct loopback
link the cost policy loads them. The same for the disk tier, slowed by a delay in its reads.

The Redis case runs the engine's prefill at a fixed, slower rate (a delay per scheduled token
before each forward, `slow_prefill`): the 2-layer tiny model recomputes 192 tokens in a few ms
on a fast machine, which an in-process Redis round trip can outlast, so whether loopback Redis
paid depended on the machine (CI on an AVX-512/AMX VM decided "recompute" for all three). At
0.4 ms per token a 192-token recompute takes ~80 ms: the loopback fetch (~192 KiB) pays on any
machine, the slow link (two 120 ms round trips) never does.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from kvstore.bench.slow_link import SlowLink
from kvstore.metrics import names
from kvstore.oracle import GreedyRun
from kvstore.vllm.engine import (
    drain,
    engine,
    generate_runs,
    kv_transfer_config,
    scheduler_connector,
)
from tests.support.oracle import assert_same_outputs
from tests.support.redis_servers import redis_server
from tiers.lmdb import LMDBStore

from .test_remote_engine import CHUNK_BYTES, HIT_TOKENS

pytestmark = [pytest.mark.engine]

PROMPTS = [[(29 * i + 11 * j) % 500 + 5 for i in range(200)] for j in range(1, 4)]


def warmup(seed: int) -> list[list[int]]:
    """Prompts only this engine sends (so it computes them: its measure of recompute)."""
    return [[(17 * i + 13 * j + 7 * seed) % 500 + 5 for i in range(200)] for j in range(1, 5)]


@dataclass
class Served:
    remote_hit_tokens: float
    decisions: dict[str, float]
    runs: list[GreedyRun]


def _serve(model: Path, url: str, policy: str, prompts: Sequence[list[int]], seed: int) -> Served:
    config = kv_transfer_config(
        cpu_bytes=64 * CHUNK_BYTES, remote_url=url, remote_timeout_ms=5000, load_policy=policy
    )
    runs: list[GreedyRun] = []
    with engine(model, kv_transfer=config) as llm:
        for prompt in warmup(seed):  # what it measures before the prompts come back
            generate_runs(llm, [prompt])
            drain(llm)
        runtime = scheduler_connector(llm).runtime
        assert runtime is not None
        registry = runtime.registry

        def remote_decisions() -> dict[str, float]:
            return {
                decision: registry.get_sample_value(
                    names.LOAD_DECISIONS, {"tier": "remote", "decision": decision}
                )
                or 0.0
                for decision in ("load", "recompute")
            }

        before = registry.get_sample_value(names.HIT_TOKENS, {"tier": "remote"}) or 0.0
        # the warm-up's own lookups are decided too (on a busy machine a probe's round trip
        # can outlast a tiny prompt's recompute): count the prompts' decisions only
        decided_before = remote_decisions()
        for prompt in prompts:
            _, served = generate_runs(llm, [prompt])
            runs.extend(served)
            drain(llm)
        hits = (registry.get_sample_value(names.HIT_TOKENS, {"tier": "remote"}) or 0.0) - before
        decided = remote_decisions()
        decisions = {name: decided[name] - decided_before[name] for name in decided}
    return Served(hits, decisions, runs)


PREFILL_S_PER_TOKEN = 0.0004


@pytest.fixture
def slow_prefill(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every forward of the in-process engine first waits 0.4 ms per scheduled token."""
    from vllm.v1.worker.cpu_worker import CPUWorker

    execute = CPUWorker.execute_model

    def slowed(self: Any, scheduler_output: Any, *args: Any, **kwargs: Any) -> Any:
        time.sleep(PREFILL_S_PER_TOKEN * scheduler_output.total_num_scheduled_tokens)
        return execute(self, scheduler_output, *args, **kwargs)

    monkeypatch.setattr(CPUWorker, "execute_model", slowed)


@pytest.mark.redis
@pytest.mark.usefixtures("slow_prefill")
def test_a_slow_redis_is_decided_against_and_a_fast_one_is_loaded(tiny_model_dir: Path) -> None:
    with redis_server() as server:
        filled = _serve(tiny_model_dir, server.url, "always", PROMPTS, seed=1)
        with SlowLink(server.address, latency_s=0.06, bytes_per_s=4e6) as link:
            slow = _serve(tiny_model_dir, link.url, "cost", PROMPTS, seed=2)
            forced = _serve(tiny_model_dir, link.url, "always", PROMPTS[:1], seed=3)
        fast = _serve(tiny_model_dir, server.url, "cost", PROMPTS, seed=4)
    assert filled.remote_hit_tokens == 0
    assert slow.remote_hit_tokens == 0, slow.decisions
    assert slow.decisions["recompute"] >= len(PROMPTS), slow.decisions
    assert forced.remote_hit_tokens == HIT_TOKENS  # the chunks were there, the link works
    assert fast.remote_hit_tokens == len(PROMPTS) * HIT_TOKENS, fast.decisions
    assert fast.decisions["recompute"] == 0, fast.decisions
    for served in (slow, fast):
        assert_same_outputs(filled.runs, served.runs)


DISK_PROMPTS = [[(37 * i + 5 * j) % 500 + 5 for i in range(200)] for j in range(1, 7)]


@pytest.mark.parametrize("is_slow", [True, False], ids=["slow-disk", "fast-disk"])
def test_a_slow_disk_is_decided_against_and_a_fast_one_is_loaded(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, is_slow: bool
) -> None:
    if is_slow:
        read = LMDBStore.get_many_into

        def slow_read(self: LMDBStore, *args: Any, **kwargs: Any) -> Any:
            time.sleep(0.25)  # a disk far slower than the tiny model's prefill
            return read(self, *args, **kwargs)

        monkeypatch.setattr(LMDBStore, "get_many_into", slow_read)  # the engine is in-process
    config = kv_transfer_config(
        cpu_bytes=8 * CHUNK_BYTES, disk_path=str(tmp_path / "store"), disk_bytes=128 * CHUNK_BYTES
    )
    first: list[GreedyRun] = []
    again: list[GreedyRun] = []
    with engine(tiny_model_dir, kv_transfer=config) as llm:
        registry = scheduler_connector(llm).runtime.registry

        def ask(prompt: list[int]) -> list[GreedyRun]:
            assert llm.reset_prefix_cache()  # kvstore's tiers serve, not the engine's cache
            _, runs = generate_runs(llm, [prompt])
            drain(llm)
            return runs

        for prompt in warmup(5) + DISK_PROMPTS:  # computed; only the last stays in CPU
            first.extend(ask(prompt))
        for prompt in warmup(5)[:3]:  # disk hits: the engine measures the disk's reads
            ask(prompt)
        gave_up = registry.get_sample_value(
            names.LOAD_DECISIONS, {"tier": "disk", "decision": "gave_up"}
        )  # the first, before the disk was measured: it waited its budget, not the read
        recompute_labels = {"tier": "disk", "decision": "recompute"}
        before = registry.get_sample_value(names.HIT_TOKENS, {"tier": "disk"}) or 0.0
        recomputed_before = registry.get_sample_value(names.LOAD_DECISIONS, recompute_labels)
        for prompt in DISK_PROMPTS[:3]:
            again.extend(ask(prompt))
        hits = (registry.get_sample_value(names.HIT_TOKENS, {"tier": "disk"}) or 0.0) - before
        recomputed = (registry.get_sample_value(names.LOAD_DECISIONS, recompute_labels) or 0.0) - (
            recomputed_before or 0.0
        )
    if is_slow:
        assert hits == 0 and recomputed == 3
        assert gave_up == 1
    else:
        assert hits == 3 * HIT_TOKENS and recomputed == 0
        assert not gave_up
    assert_same_outputs(first[4:7], again)
