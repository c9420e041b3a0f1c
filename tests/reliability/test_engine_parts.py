"""The parts of the engine scenarios (1, 2, 5, 6) that need no engine: the events-log replay,
bit rot through LMDB, verify, the live-ops loop, the token oracle, the slope and /proc sampling.
The scenarios themselves run in `make reliability-smoke` (part of `make test`)."""

from __future__ import annotations

import json
import math
import os
import random
import time
from pathlib import Path
from typing import Any, cast

import pytest

from kvstore.oracle import GreedyRun
from reliability import live_ops
from reliability.checks import Crash
from reliability.engines import EngineHost, HostError, TokenOracle, shared_prefix_prompts
from reliability.soak import (
    OpenAIServer,
    Target,
    growth_per_1k,
    process_tree,
    sample_process,
    slope_per_min,
)
from reliability.store_checks import (
    acknowledged_keys,
    flip_values,
    removed_keys,
    store_keys,
    verify_store,
)
from tiers.errors import CorruptionError
from tiers.lmdb import LMDBStore

NS = "abababababababab"


def _store(path: Path, num_chunks: int = 12) -> dict[str, bytes]:
    rng = random.Random(7)
    chunks = {rng.randbytes(8): rng.randbytes(2048) for _ in range(num_chunks)}
    with LMDBStore.open(path, capacity_bytes=1 << 22, map_size_bytes=1 << 24) as store:
        store.register_namespace(NS, {"model": "parts"})
        store.put_many(NS, list(chunks.items()))
    return {key.hex(): value for key, value in chunks.items()}


def _event(kind: str, keys: list[str], tier: str = "disk", **extra: Any) -> str:
    return json.dumps({"type": kind, "tier": tier, "keys": keys, **extra})


def test_acknowledged_keys_replay_stored_and_removed(tmp_path: Path) -> None:
    log = tmp_path / "events.jsonl"
    log.with_name("events.jsonl.1").write_text(_event("stored", ["aa", "bb"]) + "\n")
    log.write_text(
        "\n".join(
            [
                _event("stored", ["cc"]),
                _event("removed", ["aa"], reason="evicted"),
                _event("stored", ["dd"], tier="cpu"),
                _event("removed", ["cc"], reason="corrupt"),
                '{"type": "stored", "tier": "disk", "keys": ["ee"',  # torn by a SIGKILL
            ]
        )
    )
    assert acknowledged_keys(log) == {"bb"}
    assert removed_keys(log, "corrupt") == {"cc"}
    assert removed_keys(log, "evicted") == {"aa"}
    assert acknowledged_keys(tmp_path / "missing.jsonl") == set()


def test_flipped_values_are_caught_by_the_store_and_by_verify(tmp_path: Path) -> None:
    path = tmp_path / "store"
    chunks = _store(path)
    only = frozenset(sorted(chunks)[:6])
    flips = flip_values(path, 3, random.Random(1), only=only)
    flipped = {flip.chunk_hex for flip in flips}
    assert len(flipped) == 3 and flipped <= only
    with LMDBStore.open(path, readonly=True, create=False) as store:
        for key, value in chunks.items():
            out = bytearray(len(value))
            if key in flipped:
                with pytest.raises(CorruptionError):
                    store.get_into(NS, bytes.fromhex(key), out)
            else:
                assert store.get_into(NS, bytes.fromhex(key), out) == len(value)
                assert bytes(out) == value
    verified = verify_store(path)
    assert (verified.exit_code, set(verified.corrupt_keys)) == (1, flipped)
    assert verify_store(path, repair=True).num_repaired == 3
    assert verify_store(path).is_ok
    assert store_keys(path) == set(chunks) - flipped


def test_live_ops_loop_runs_every_command_without_failures(tmp_path: Path) -> None:
    path = tmp_path / "store"
    _store(path, num_chunks=40)
    report = live_ops.run(path, seconds=3.0, seed=3)
    assert report.failures == []
    assert sum(report.num_commands.values()) >= 3
    assert sum(report.num_removed.values()) > 0


def test_live_ops_reports_a_corrupt_store(tmp_path: Path) -> None:
    path = tmp_path / "store"
    _store(path)
    flip_values(path, 1, random.Random(2))
    with pytest.raises(Crash, match="corrupt"):
        live_ops._one(path, "verify-repair", random.Random(0))


def test_token_oracle_fails_a_clear_divergence_and_accepts_a_near_tie() -> None:
    prompts = [[5, 6, 7], [8, 9]]
    reference = {
        (5, 6, 7): GreedyRun((1, 2, 3), (1.0, 1.0, 1.0)),
        (8, 9): GreedyRun((4, 5, 6), (1.0, 1e-5, 1.0)),
    }
    oracle = TokenOracle(reference)
    same = {"outputs": [[1, 2, 3], [4, 9, 9]], "top2_gaps": [[math.inf] * 3] * 2}
    assert oracle.check(prompts, same) == 0  # the second differs at a near-tie only
    wrong = {"outputs": [[1, 7, 3], [4, 5, 6]], "top2_gaps": [[math.inf] * 3] * 2}
    assert oracle.check(prompts, wrong) == 1
    assert oracle.figures() == {"sequences_checked": 4, "cut_at_near_ties": 1, "diverged": 1}
    assert "DIVERGED at token 1" in oracle.failures[0]


def test_prompts_of_a_family_share_their_prefix() -> None:
    prompts = shared_prefix_prompts(
        random.Random(0), num_families=2, per_family=3, prefix_tokens=(40, 40)
    )
    assert len(prompts) == 6
    assert prompts[0][:40] == prompts[2][:40] != prompts[3][:40]
    assert all(5 <= token < 512 for prompt in prompts for token in prompt)


def test_slope_is_least_squares_per_minute() -> None:
    times = [0.0, 30.0, 60.0, 90.0]
    assert slope_per_min(times, [10.0, 11.0, 12.0, 13.0]) == pytest.approx(2.0)
    assert slope_per_min(times, [5.0, 5.0, 5.0, 5.0]) == 0.0
    assert slope_per_min([1.0], [3.0]) == 0.0


def test_growth_per_1k_requests_divides_the_slope_by_the_request_rate() -> None:
    target = Target("t", cast(OpenAIServer, None))
    target.completion_times_s = [10.0 + i * 0.06 for i in range(1001)]  # 1000/min after 10 s
    target.rss_mb = {"worker": [(10.0, 100.0), (40.0, 101.0), (70.0, 102.0)]}
    per_min, per_1k = growth_per_1k(target, warmup_s=10.0)["worker"]
    assert per_min == pytest.approx(2.0)
    assert per_1k == pytest.approx(2.0, rel=0.01)


def test_process_sampling_reads_this_process() -> None:
    sample = sample_process(os.getpid())
    assert sample is not None and sample.rss_bytes > 0 and sample.num_fds > 0
    assert process_tree(os.getpid())[0] == os.getpid()
    assert sample_process(2**22 + 1) is None


@pytest.mark.engine
def test_engine_host_answers_refuses_and_dies_by_sigkill(tmp_path: Path) -> None:
    """The child protocol without an engine: an unknown op and a failing op are answers that
    say so (the child lives on); after SIGKILL the answers that arrived are still read."""
    host = EngineHost(tmp_path / "host.log", name="test host")
    try:
        host.wait_ready()
        with pytest.raises(HostError, match="unknown op"):
            host.call({"op": "nonsense"})
        with pytest.raises(HostError, match="generate failed"):
            host.call({"op": "generate", "prompts": [[5, 6]]})  # no engine started
        assert host.call({"op": "summary"}) == {"op": "summary", "ok": True}
        host.send({"op": "close"})
        assert host.receive(60)["op"] == "close"
        host.send({"op": "close"})
        time.sleep(1.0)
        host.kill()
        assert [answer["op"] for answer in host.drain_answers()] == ["close"]
        assert not host.is_alive()
    finally:
        host.close()
