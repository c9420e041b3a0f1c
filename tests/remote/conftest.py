"""Fixtures of the remote tier tests: real redis-server processes (never a mock)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import pytest

from kvstore.keys import BlockKey
from kvstore.namespace import NamespaceDescriptor
from kvstore.remote import RemoteConfig
from tests.support.redis_servers import (
    RedisClusterServers,
    RedisServer,
    redis_cluster,
    redis_server,
)

TIMEOUT_MS = 300
"""Short, so the fault tests are fast; loopback round trips take well under 1 ms."""


def make_config(url: str, **overrides: object) -> RemoteConfig:
    """A config for `url` with a short timeout and a quick breaker (overridable)."""
    values: dict[str, object] = {"remote_url": url, "remote_timeout_ms": TIMEOUT_MS}
    values.update({k: v for k, v in overrides.items() if k.startswith("remote_")})
    config = RemoteConfig.from_values(values)
    assert config is not None
    tuning = {"breaker_failures": 2, "breaker_backoff_s": 0.2, "breaker_backoff_max_s": 0.8}
    tuning.update({k: v for k, v in overrides.items() if not k.startswith("remote_")})
    return dataclasses.replace(config, **tuning)  # type: ignore[arg-type]


def descriptor(model: str = "tiny-llama", row_bytes: int = 4096) -> NamespaceDescriptor:
    return NamespaceDescriptor(
        model=model,
        kv_dtype="bfloat16",
        engine_block_size=16,
        blocks_per_chunk=1,
        tp_size=1,
        device_type="cpu",
        attention_backend="TORCH_SDPA",
        hash_algo="sha256",
        row_bytes=row_bytes,
        layout={},
    )


def key(i: int) -> BlockKey:
    return BlockKey(i.to_bytes(8, "big"))


def payload(i: int, size: int = 4096) -> bytes:
    return bytes((i * 31 + j) % 251 for j in range(256)) * (size // 256)


@pytest.fixture
def server() -> Iterator[RedisServer]:
    with redis_server() as srv:
        yield srv


@pytest.fixture(scope="module")
def shared_cluster() -> Iterator[RedisClusterServers]:
    """A cluster the tests of one module share: do not kill its nodes (use `cluster`)."""
    with redis_cluster() as cluster:
        yield cluster


@pytest.fixture
def cluster() -> Iterator[RedisClusterServers]:
    """A cluster of one's own, to break."""
    with redis_cluster() as cluster:
        yield cluster
