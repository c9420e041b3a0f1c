"""kvstore's configuration: the keys of `kv_connector_extra_config`, validated at start.

Every bad value fails with a `ConfigError` that names the key and what is allowed, so a typo in
`--kv-transfer-config` stops the engine at start instead of surfacing as a miss later.
"""

from __future__ import annotations

import difflib
import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from kvstore.errors import ConfigError
from kvstore.index.config import WRITE_POLICIES, write_policy_problem
from kvstore.policies import POLICY_NAMES
from kvstore.remote.config import RemoteConfig

__all__ = ["EVICTION_POLICIES", "WRITE_POLICIES", "KVStoreConfig", "parse_size"]

EVICTION_POLICIES = POLICY_NAMES
LOAD_FAILURE_POLICIES = ("recompute", "fail")
_SIZE_SUFFIXES = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_size(key: str, value: object) -> int:
    """A byte size: an int, or a string like "4GiB", "512M", "1.5g"."""
    if isinstance(value, bool):
        raise ConfigError(f"{key}: expected a size in bytes, got {value!r}")
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str):
        text = value.strip().lower().removesuffix("ib").removesuffix("b")
        scale = _SIZE_SUFFIXES.get(text[-1:], 1)
        number = text[:-1] if text[-1:] in _SIZE_SUFFIXES else text
        try:
            return int(float(number) * scale)
        except (ValueError, OverflowError):  # not a number, NaN or infinite
            pass
    raise ConfigError(f"{key}: expected a size in bytes (e.g. 4294967296 or '4GiB'), got {value!r}")


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
    load_failure_policy: str = "recompute"
    shutdown_timeout_s: float = 10.0
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
        extra = dict(extra or {})
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(extra) - known, key=repr)
        if unknown:
            raise ConfigError(
                f"unknown kv_connector_extra_config key(s) {unknown}{_did_you_mean(unknown, known)}"
                f"; allowed: {sorted(known)}"
            )
        values: dict[str, Any] = {}
        for name, value in extra.items():
            values[name] = _PARSERS.get(name, _identity)(name, value)
        config = cls(**values)
        config.validate()
        return config

    def validate(self) -> None:
        _require(self.cpu_bytes > 0, "cpu_bytes", f"must be > 0 bytes, got {self.cpu_bytes}")
        if self.disk_path is None:
            _require(self.disk_bytes == 0, "disk_bytes", "is set but disk_path is not")
        else:
            _require(self.disk_bytes > 0, "disk_bytes", "must be > 0 when disk_path is set")
        if self.block_size is not None:
            _require(self.block_size > 0, "block_size", f"must be > 0, got {self.block_size}")
        _choice("eviction_policy", self.eviction_policy, EVICTION_POLICIES)
        if self.disk_eviction_policy is not None:
            _choice("disk_eviction_policy", self.disk_eviction_policy, EVICTION_POLICIES)
        problem = write_policy_problem(self.write_policy)
        _require(problem is None, "write_policy", problem or "")
        _choice("load_failure_policy", self.load_failure_policy, LOAD_FAILURE_POLICIES)
        _require(self.admission_min_sightings >= 1, "admission_min_sightings", "must be >= 1")
        if self.metrics_port is not None:
            _require(0 <= self.metrics_port <= 65535, "metrics_port", "must be in 0..65535")
        _require(self.disk_queue_chunks >= 1, "disk_queue_chunks", "must be >= 1")
        _require(self.shutdown_timeout_s > 0, "shutdown_timeout_s", "must be > 0 seconds")
        _require(self.events_log_max_bytes >= 4096, "events_log_max_bytes", "must be >= 4096")
        _require(self.sync_load_budget_bytes >= 0, "sync_load_budget_bytes", "must be >= 0")
        _require(
            self.step_copy_budget_bytes >= 0,
            "step_copy_budget_bytes",
            "must be >= 0 (0 = no limit)",
        )
        self.remote_config()  # every remote_* key, named in its error


def _did_you_mean(unknown: list[Any], known: set[str]) -> str:
    """`" (did you mean 'cpu_bytes'?)"` for a near miss, else `""`."""
    guesses = [
        close[0]
        for key in unknown
        if isinstance(key, str) and (close := difflib.get_close_matches(key, known, n=1))
    ]
    return f" (did you mean {', '.join(map(repr, guesses))}?)" if guesses else ""


def _require(ok: bool, key: str, message: str) -> None:
    if not ok:
        raise ConfigError(f"{key}: {message}")


def _choice(key: str, value: str, allowed: tuple[str, ...]) -> None:
    _require(value in allowed, key, f"got {value!r}; allowed: {', '.join(allowed)}")


def _identity(key: str, value: Any) -> Any:
    return value


def _int(key: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ConfigError(f"{key}: expected an integer, got {value!r}")
    try:
        return int(value)
    except ValueError as exc:
        raise ConfigError(f"{key}: expected an integer, got {value!r}") from exc


def _optional_int(key: str, value: object) -> int | None:
    return None if value is None else _int(key, value)


def _float(key: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ConfigError(f"{key}: expected a number, got {value!r}")
    try:
        number = float(value)
    except (ValueError, OverflowError) as exc:
        raise ConfigError(f"{key}: expected a number, got {value!r}") from exc
    if not math.isfinite(number):
        raise ConfigError(f"{key}: expected a finite number, got {value!r}")
    return number


def _bool(key: str, value: object) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false", "1", "0"):
        return value.strip().lower() in ("true", "1")
    raise ConfigError(f"{key}: expected true or false, got {value!r}")


def _str(key: str, value: object) -> str:
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{key}: expected a non-empty string, got {value!r}")
    return value


def _identity_str(key: str, value: object) -> str:
    if not isinstance(value, str):
        raise ConfigError(f"{key}: expected a string, got {value!r}")
    return value


def _optional_str(key: str, value: object) -> str | None:
    return None if value is None else _str(key, value)


def _path(key: str, value: object) -> Path:
    if "\0" in _str(key, value):
        raise ConfigError(f"{key}: a path cannot contain a NUL character, got {value!r}")
    return Path(os.path.expanduser(_str(key, value)))


def _optional_path(key: str, value: object) -> Path | None:
    return None if value is None else _path(key, value)


def _lower_str(key: str, value: object) -> str:
    return _str(key, value).lower()


def _optional_lower_str(key: str, value: object) -> str | None:
    return None if value is None else _lower_str(key, value)


_PARSERS: dict[str, Callable[[str, Any], Any]] = {
    "cpu_bytes": parse_size,
    "disk_path": _optional_path,
    "disk_bytes": parse_size,
    "block_size": _optional_int,
    "eviction_policy": _lower_str,
    "disk_eviction_policy": _optional_lower_str,
    "write_policy": _lower_str,
    "admission_min_sightings": _int,
    "region_dir": _path,
    "metrics_port": _optional_int,
    "metrics_host": _str,
    "events_endpoint": _optional_str,
    "events_replay_endpoint": _optional_str,
    "events_topic": _str,
    "events_log": _optional_path,
    "events_log_max_bytes": parse_size,
    "disk_queue_chunks": _int,
    "load_failure_policy": _lower_str,
    "shutdown_timeout_s": _float,
    "namespace_salt": _identity_str,
    "sync_load_budget_bytes": parse_size,
    "step_copy_budget_bytes": parse_size,
    "audit_loads": _bool,
    # remote_* values are checked by RemoteConfig (in validate), with its own messages
}
