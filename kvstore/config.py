"""kvstore's configuration: the keys of `kv_connector_extra_config`, validated at start.

Every bad value fails with a `ConfigError` that names the key and what is allowed, so a typo in
`--kv-transfer-config` stops the engine at start instead of surfacing as a miss later.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from kvstore.errors import ConfigError
from kvstore.index.config import WRITE_POLICIES, write_policy_problem
from kvstore.options import (
    Parser,
    check_choice,
    parse_bool,
    parse_float,
    parse_int,
    parse_lower_str,
    parse_optional_int,
    parse_optional_lower_str,
    parse_optional_path,
    parse_optional_str,
    parse_path,
    parse_size,
    parse_str,
    parse_text,
    parse_values,
    require,
)
from kvstore.policies import POLICY_NAMES
from kvstore.remote.config import RemoteConfig

__all__ = ["EVICTION_POLICIES", "WRITE_POLICIES", "KVStoreConfig", "parse_size"]

EVICTION_POLICIES = POLICY_NAMES
LOAD_FAILURE_POLICIES = ("recompute", "fail")
LOAD_POLICIES = ("cost", "always")  # see kvstore.pipeline.load_cost
DISK_WRITERS = ("process", "thread")  # see kvstore.diskwriter


@dataclass(frozen=True, slots=True)
class KVStoreConfig:
    """Validated kvstore settings (see README, "Configuration")."""

    cpu_bytes: int = 1 << 30
    disk_path: Path | None = None
    disk_bytes: int = 0
    block_size: int | None = None  # tokens per chunk; None = the engine's block size
    eviction_policy: str = "lru"
    disk_eviction_policy: str | None = None  # None = same as eviction_policy
    write_policy: str = "write_through"
    admission_min_sightings: int = 1
    region_dir: Path = Path("/dev/shm")
    metrics_port: int | None = None
    metrics_host: str = "127.0.0.1"
    events_endpoint: str | None = None
    events_replay_endpoint: str | None = None
    events_topic: str = "kv-events"
    events_log: Path | None = None
    events_log_max_bytes: int = 64 << 20
    disk_queue_chunks: int = 256
    # `process`: LMDB writes run in a child process at idle CPU/IO priority (kvstore.diskwriter);
    # `thread`: on a thread of the engine's process, beside vLLM's scheduler and model runner.
    disk_writer: str = "process"
    load_failure_policy: str = "recompute"
    # `cost`: a hit on disk or in Redis is loaded only when that is expected to beat recomputing
    # it (kvstore.pipeline.load_cost); `always`: every hit is loaded.
    load_policy: str = "cost"
    shutdown_timeout_s: float = 10.0
    # A lookup that finds disk-only chunks waits up to this long for their read into CPU rows,
    # so a fast read costs no extra scheduler step (0: answer "pending" at once).
    promotion_wait_ms: float = 20.0
    namespace_salt: str = ""  # change it when the weights behind a model name change
    # A CPU-tier hit is loaded in the step that computes the rest of the prompt (vLLM is told
    # `load_kv_async=False`) while that step's sync loads stay within this many bytes; a larger
    # hit is loaded over the next steps, `step_copy_budget_bytes` at a time.
    sync_load_budget_bytes: int = 256 << 20
    # CPU platform: bytes per step copied for queued loads, and (separately) for stores.
    step_copy_budget_bytes: int = 256 << 20
    # Re-read every loaded chunk and compare it with the digest taken when it was stored
    # (debugging and tests: costs a digest per store and a gather per load).
    audit_loads: bool = False
    # The shared remote tier (Redis / Redis Cluster): see kvstore.remote.config for each key.
    remote_url: str | None = None
    remote_password_env: str | None = None
    remote_timeout_ms: int = 500
    remote_queue_chunks: int = 256
    remote_write: bool = True
    # Hybrid models (vLLM's hybrid KV cache manager on): a sliding-window group's chunks are
    # kept for hits at the end of each prompt's and each answer's full chunks and at every
    # multiple of this many tokens (rounded down to whole chunks; 0: those ends only). See
    # kvstore.vllm.hybrid.
    hybrid_retention_tokens: int = 1024

    @property
    def has_disk(self) -> bool:
        return self.disk_path is not None

    def remote_config(self) -> RemoteConfig | None:
        """The remote tier's settings, validated (None without `remote_url`)."""
        return RemoteConfig.from_values(
            {
                "remote_url": self.remote_url,
                "remote_password_env": self.remote_password_env,
                "remote_timeout_ms": self.remote_timeout_ms,
                "remote_queue_chunks": self.remote_queue_chunks,
                "remote_write": self.remote_write,
            }
        )

    @classmethod
    def from_extra_config(cls, extra: Mapping[str, Any] | None) -> KVStoreConfig:
        """Parse `kv_connector_extra_config`; unknown keys and bad values raise ConfigError."""
        if extra is not None and not isinstance(extra, Mapping):
            raise ConfigError(f"kv_connector_extra_config must be a mapping, got {extra!r:.80}")
        known = [f.name for f in fields(cls)]
        what = "kv_connector_extra_config key(s)"
        values = parse_values(dict(extra or {}), _PARSERS, known=known, what=what)
        config = cls(**values)
        config.validate()
        return config

    def validate(self) -> None:
        require(self.cpu_bytes > 0, "cpu_bytes", f"must be > 0 bytes, got {self.cpu_bytes}")
        if self.disk_path is None:
            require(self.disk_bytes == 0, "disk_bytes", "is set but disk_path is not")
        else:
            require(self.disk_bytes > 0, "disk_bytes", "must be > 0 when disk_path is set")
        if self.block_size is not None:
            require(self.block_size > 0, "block_size", f"must be > 0, got {self.block_size}")
        check_choice("eviction_policy", self.eviction_policy, EVICTION_POLICIES)
        if self.disk_eviction_policy is not None:
            check_choice("disk_eviction_policy", self.disk_eviction_policy, EVICTION_POLICIES)
        problem = write_policy_problem(self.write_policy)
        require(problem is None, "write_policy", problem or "")
        check_choice("load_failure_policy", self.load_failure_policy, LOAD_FAILURE_POLICIES)
        check_choice("load_policy", self.load_policy, LOAD_POLICIES)
        check_choice("disk_writer", self.disk_writer, DISK_WRITERS)
        require(self.admission_min_sightings >= 1, "admission_min_sightings", "must be >= 1")
        if self.metrics_port is not None:
            require(0 <= self.metrics_port <= 65535, "metrics_port", "must be in 0..65535")
        require(self.disk_queue_chunks >= 1, "disk_queue_chunks", "must be >= 1")
        require(self.shutdown_timeout_s > 0, "shutdown_timeout_s", "must be > 0 seconds")
        require(0 <= self.promotion_wait_ms <= 1000, "promotion_wait_ms", "must be in 0..1000 ms")
        require(self.events_log_max_bytes >= 4096, "events_log_max_bytes", "must be >= 4096")
        require(self.sync_load_budget_bytes >= 0, "sync_load_budget_bytes", "must be >= 0")
        require(
            self.step_copy_budget_bytes >= 0,
            "step_copy_budget_bytes",
            "must be >= 0 (0 = no limit)",
        )
        require(self.hybrid_retention_tokens >= 0, "hybrid_retention_tokens", "must be >= 0")
        self.remote_config()  # every remote_* key, named in its error


_PARSERS: dict[str, Parser] = {
    "cpu_bytes": parse_size,
    "disk_path": parse_optional_path,
    "disk_bytes": parse_size,
    "block_size": parse_optional_int,
    "hybrid_retention_tokens": parse_int,
    "eviction_policy": parse_lower_str,
    "disk_eviction_policy": parse_optional_lower_str,
    "write_policy": parse_lower_str,
    "admission_min_sightings": parse_int,
    "region_dir": parse_path,
    "metrics_port": parse_optional_int,
    "metrics_host": parse_str,
    "events_endpoint": parse_optional_str,
    "events_replay_endpoint": parse_optional_str,
    "events_topic": parse_str,
    "events_log": parse_optional_path,
    "events_log_max_bytes": parse_size,
    "disk_queue_chunks": parse_int,
    "disk_writer": parse_lower_str,
    "load_failure_policy": parse_lower_str,
    "load_policy": parse_lower_str,
    "shutdown_timeout_s": parse_float,
    "promotion_wait_ms": parse_float,
    "namespace_salt": parse_text,
    "sync_load_budget_bytes": parse_size,
    "step_copy_budget_bytes": parse_size,
    "audit_loads": parse_bool,
    # remote_* values are checked by RemoteConfig (in validate), with its own messages
}
