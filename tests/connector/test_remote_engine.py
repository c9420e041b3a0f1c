"""The remote tier on the real engine, against real Redis servers started by the test.

Engines run in their own processes (as replicas would): what one stores, another serves; a
dead, wrong or damaged Redis never stops or corrupts serving.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from kvstore.testing.subprocess_run import run_engine_process
from kvstore.tiny_model import TinyLlamaSpec
from kvstore.vllm.engine import engine, generate_runs, kv_transfer_config
from tests.support.oracle import assert_same_outputs, runs_from
from tests.support.redis_servers import redis_cluster, redis_server

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
        first = run_engine_process(_spec(tiny_model_dir, remote_url=server.url))
        assert _tiers(first)["remote"]["stored_chunks"] == 6
        second = run_engine_process(_spec(tiny_model_dir, remote_url=server.url))
    assert _tiers(second)["remote"]["hit_tokens"] == HIT_TOKENS, second["summary"]
    assert second["num_cached_tokens"] == [HIT_TOKENS]
    assert_same_outputs(runs_from(first), runs_from(second))


def test_replicas_share_prefixes_through_a_redis_cluster(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    with redis_cluster() as cluster:
        first = run_engine_process(_spec(tiny_model_dir, remote_url=cluster.url))
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
    assert _tiers(second)["disk"]["stored_chunks"] == 6
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
        first = run_engine_process(_spec(tiny_model_dir, remote_url=server.url))
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
