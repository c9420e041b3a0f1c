"""The remote tier on the real engine, against real Redis servers started by the test.

Engines run in their own processes (as replicas would): what one stores, another serves; a
dead, wrong or damaged Redis never stops or corrupts serving.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from kvstore.tiny_model import TinyLlamaSpec
from kvstore.vllm.engine import engine, generate_runs, kv_transfer_config
from tests.support.oracle import assert_same_outputs, runs_from
from tests.support.redis_servers import redis_cluster, redis_server
from tests.support.subprocess_run import run_engine_here, run_engine_process

pytestmark = [pytest.mark.engine, pytest.mark.redis]

CHUNK_BYTES = TinyLlamaSpec().kv_bytes_per_token * 32
PROMPT = [(23 * i + 9) % 500 + 5 for i in range(200)]
HIT_TOKENS = 192


def _spec(model: Path, **extra: Any) -> dict[str, Any]:
    return {
        "model_dir": str(model),
        "prompts": [PROMPT],
        "extra": {"cpu_bytes": 64 * CHUNK_BYTES, **extra},
    }


def _tiers(result: dict[str, Any]) -> dict[str, Any]:
    assert result["returncode"] == 0, result["stderr_tail"]
    tiers: dict[str, Any] = result["summary"]["tiers"]
    return tiers


def test_a_second_engine_gets_remote_hits(tiny_model_dir: Path) -> None:
    with redis_server() as server:
        first = run_engine_here(_spec(tiny_model_dir, remote_url=server.url))
        assert _tiers(first)["remote"]["stored_chunks"] == 6
        client = server.client()
        (descriptor_key,) = client.scan_iter(match=b"kvstore:*:descriptor")
        descriptor = json.loads(client.get(descriptor_key))
        client.close()
        assert descriptor["chunk_layout"]["layers"]  # the CLI can decode remote chunks
        second = run_engine_process(_spec(tiny_model_dir, remote_url=server.url))
    assert _tiers(second)["remote"]["hit_tokens"] == HIT_TOKENS, second["summary"]
    assert second["num_cached_tokens"] == [HIT_TOKENS]
    assert_same_outputs(runs_from(first), runs_from(second))


def test_replicas_share_prefixes_through_a_redis_cluster(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    with redis_cluster() as cluster:
        first = run_engine_here(_spec(tiny_model_dir, remote_url=cluster.url))
        # the second replica has a local disk too: remote hits are kept there as well
        second = run_engine_process(
            _spec(
                tiny_model_dir,
                remote_url=cluster.url,
                disk_path=str(tmp_path / "store"),
                disk_bytes=64 * CHUNK_BYTES,
            )
        )
    assert _tiers(second)["remote"]["hit_tokens"] == HIT_TOKENS, second["summary"]
    assert _tiers(second)["disk"]["stored_chunks"] == 6, json.dumps(second["summary"])
    assert_same_outputs(runs_from(first), runs_from(second))


def test_a_dead_remote_never_stops_serving(tiny_model_dir: Path) -> None:
    with redis_server() as server:
        url = server.url
    # nothing listens there now: the engine starts (a warning) and serves from CPU
    config = kv_transfer_config(cpu_bytes=64 * CHUNK_BYTES, remote_url=url, remote_timeout_ms=200)
    with engine(tiny_model_dir, kv_transfer=config) as llm:
        start = time.monotonic()
        _, first = generate_runs(llm, [PROMPT])
        elapsed = time.monotonic() - start
        assert llm.reset_prefix_cache()
        outputs, again = generate_runs(llm, [PROMPT])
    assert elapsed < 30
    assert outputs[0].num_cached_tokens == HIT_TOKENS  # from the CPU tier
    assert_same_outputs(first, again)


def test_a_corrupted_remote_value_is_a_miss_and_is_deleted(tiny_model_dir: Path) -> None:
    with redis_server() as server:
        first = run_engine_here(_spec(tiny_model_dir, remote_url=server.url))
        client = server.client()
        keys = sorted(client.scan_iter(match=b"kvstore:*:*"))
        chunk_keys = [k for k in keys if not k.endswith(b":descriptor")]
        assert len(chunk_keys) == 6
        client.setrange(chunk_keys[0], 100, b"\xff\xff\xff\xff")
        second = run_engine_process(_spec(tiny_model_dir, remote_url=server.url))
        remaining = client.exists(chunk_keys[0])
        client.close()
    tiers = _tiers(second)
    assert tiers["remote"]["checksum_failures"] >= 1, second["summary"]
    assert tiers["remote"]["hit_tokens"] < HIT_TOKENS
    assert remaining == 0 or tiers["remote"]["stored_chunks"] >= 1  # deleted, or rewritten
    assert_same_outputs(runs_from(first), runs_from(second))


def test_a_wrong_password_fails_at_start_naming_the_key(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KVSTORE_TEST_REDIS_PASSWORD", "not-the-password")
    with redis_server(password="the-password") as server:
        config = kv_transfer_config(
            cpu_bytes=64 * CHUNK_BYTES,
            remote_url=server.url,
            remote_password_env="KVSTORE_TEST_REDIS_PASSWORD",
        )
        with (
            pytest.raises(Exception, match="remote_password_env") as caught,
            engine(tiny_model_dir, kv_transfer=config),
        ):
            pass
    assert "not-the-password" not in str(caught.value)


def _prompt(seed: int) -> list[int]:
    return [(29 * i + 31 * seed) % 500 + 5 for i in range(200)]


def _wait(predicate: Any, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.2)


def test_redis_killed_mid_run_and_restarted(tiny_model_dir: Path) -> None:
    """Serving never stops while Redis is down; once it is back, the breaker closes and
    writes land again."""
    from kvstore.vllm.engine import scheduler_connector

    with redis_server() as server:
        config = kv_transfer_config(
            cpu_bytes=64 * CHUNK_BYTES, remote_url=server.url, remote_timeout_ms=300
        )
        with engine(tiny_model_dir, kv_transfer=config) as llm:
            registry = scheduler_connector(llm).runtime.registry

            def remote_stored() -> float:
                return registry.get_sample_value(
                    "kvstore_stored_chunks_total", {"tier": "remote"}
                ) or 0.0

            generate_runs(llm, [_prompt(1)])
            _wait(lambda: remote_stored() >= 6)
            server.kill()
            start = time.monotonic()
            for seed in (2, 3, 4):  # writes fail, the breaker opens; requests are served
                outputs, _ = generate_runs(llm, [_prompt(seed)])
                assert len(outputs[0].outputs[0].token_ids) == 8
            assert time.monotonic() - start < 60
            open_nodes = registry.get_sample_value(
                "kvstore_remote_breaker_nodes", {"state": "open"}
            )
            assert open_nodes == 1
            server.restart()
            before = remote_stored()
            deadline = time.monotonic() + 60
            seed = 10
            while remote_stored() <= before:  # the breaker probes after its backoff
                assert time.monotonic() < deadline, "remote writes did not resume"
                generate_runs(llm, [_prompt(seed)])
                seed += 1
                time.sleep(0.5)
            closed = registry.get_sample_value("kvstore_remote_breaker_nodes", {"state": "closed"})
            assert closed == 1


def test_redis_evictions_become_one_removed_event_each(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """Redis evicts under maxmemory (allkeys-lru); each evicted chunk is reported removed from
    the remote tier exactly once: the removed keys are exactly those stored and now gone."""
    import json

    from kvstore.vllm.engine import drain

    log = tmp_path / "events.jsonl"
    with redis_server(maxmemory="2mb", maxmemory_policy="allkeys-lru") as server:
        config = kv_transfer_config(
            cpu_bytes=64 * CHUNK_BYTES, remote_url=server.url, events_log=str(log)
        )
        client = server.client()
        with engine(tiny_model_dir, kv_transfer=config) as llm:
            for seed in range(30):  # 30 x 6 chunks of 32 KiB: far over 2 MB
                generate_runs(llm, [_prompt(100 + seed)], max_tokens=1)
            _wait(lambda: int(client.info("stats")["evicted_keys"]) > 0)
            time.sleep(2.0)  # the last notifications
            drain(llm)  # apply them (vLLM's next step would)
        present = {
            key.decode().rsplit(":", 1)[1]
            for key in client.scan_iter(match=b"kvstore:*")
            if not key.endswith(b":descriptor")
        }
        client.close()
    stored: set[str] = set()
    removed: list[str] = []
    for line in log.read_text().splitlines():
        record = json.loads(line)
        if record["tier"] == "remote":
            (stored.update if record["type"] == "stored" else removed.extend)(record["keys"])
    assert removed, "Redis evicted nothing"
    assert len(removed) == len(set(removed))  # each at most once
    assert set(removed) == stored - present
