"""`LMDBTier`'s options (the keys of its `secondary_tiers` entry) and its namespace.

Every option is checked when vLLM builds the tier; a bad or unknown key stops the engine with a
`ConfigError` naming the key and what is allowed. The namespace fingerprints what vLLM's
`OffloadingConfig` says about the bytes of one primary slot (model, KV dtype, groups, layers,
chunk and hash sizes, parallelism, host layout) plus the slot size and the device type, so an
engine that would read the bytes differently never sees them.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

import kvstore
from kvstore.config import parse_size
from kvstore.errors import ConfigError
from kvstore.namespace import NamespaceDescriptor
from kvstore.policies import POLICY_NAMES

if TYPE_CHECKING:
    from vllm.v1.kv_offload.config import OffloadingConfig

__all__ = ["KEY_FORMAT", "LMDBTierOptions", "tier_descriptor"]

KEY_FORMAT = "vllm_offload_key"
"""What the store's keys are: vLLM `OffloadKey`s (block hash + 4-byte big-endian group index)."""

_LOCALITIES = ("LOCAL", "REMOTE")


@dataclass(frozen=True, slots=True)
class LMDBTierOptions:
    """Validated options of one `LMDBTier` (see README, "LMDBTier for vLLM's
    OffloadingConnector")."""

    path: Path
    capacity_bytes: int
    eviction_policy: str = "lru"
    num_read_threads: int = 2
    namespace_salt: str = ""
    enable_kv_events: bool = True
    locality: str | None = None
    metrics_port: int | None = None
    metrics_host: str = "127.0.0.1"
    shutdown_timeout_s: float = 30.0

    @classmethod
    def from_options(cls, options: Mapping[str, Any]) -> LMDBTierOptions:
        """Parse the tier's keyword options; unknown keys and bad values raise ConfigError."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(options) - known)
        if unknown:
            raise ConfigError(f"unknown LMDBTier option(s) {unknown}; allowed: {sorted(known)}")
        for required in ("path", "capacity_bytes"):
            if options.get(required) is None:
                raise ConfigError(f"LMDBTier option {required!r} is required")
        values = {name: _PARSERS[name](name, value) for name, value in options.items()}
        parsed = cls(**values)
        parsed.validate()
        return parsed

    def validate(self) -> None:
        _require(self.capacity_bytes > 0, "capacity_bytes", f"got {self.capacity_bytes}")
        _require(
            self.eviction_policy in POLICY_NAMES,
            "eviction_policy",
            f"got {self.eviction_policy!r}; allowed: {', '.join(POLICY_NAMES)}",
        )
        _require(1 <= self.num_read_threads <= 64, "num_read_threads", "must be in 1..64")
        if self.locality is not None:
            _require(
                self.locality in _LOCALITIES,
                "locality",
                f"got {self.locality!r}; allowed: {', '.join(_LOCALITIES)}",
            )
        if self.metrics_port is not None:
            _require(0 <= self.metrics_port <= 65535, "metrics_port", "must be in 0..65535")
        _require(self.shutdown_timeout_s > 0, "shutdown_timeout_s", "must be > 0 seconds")


def tier_descriptor(
    config: OffloadingConfig, slot_bytes: int, *, salt: str, device_type: str
) -> NamespaceDescriptor:
    """The namespace of the chunks an engine with `config` writes (one primary slot each)."""
    groups = config.groups
    if not groups:
        raise ConfigError("LMDBTier: the offloading config has no KV cache groups")
    return NamespaceDescriptor(
        model=str(config.model.name),
        kv_dtype=str(config.model.dtype).removeprefix("torch."),
        engine_block_size=int(groups[0].tokens_per_block),
        blocks_per_chunk=int(config.cache.blocks_per_chunk),
        tp_size=int(config.parallel.tp_size),
        device_type=device_type,
        attention_backend="auto",  # the page layout is pinned by layout.kv_cache_layout
        hash_algo=KEY_FORMAT,
        row_bytes=slot_bytes,
        layout=_layout(config),
        salt=salt,
        created_by=f"kvstore {kvstore.__version__} LMDBTier",
    )


def _layout(config: OffloadingConfig) -> dict[str, Any]:
    """Everything else `OffloadingConfig` says about how a slot's bytes are laid out."""
    parallel = config.parallel
    return {
        "kv_cache_layout": str(config.kv_cache_layout or "default"),
        "layers": [name for group in config.groups for name in group.layer_names],
        "groups": [
            {
                "group_id": group.group_id,
                "tokens_per_block": group.tokens_per_block,
                "layer_names": list(group.layer_names),
            }
            for group in config.groups
        ],
        "tokens_per_hash": config.cache.tokens_per_hash,
        "worker_kv_bytes_per_block": config.worker_kv_bytes_per_block,
        "world_size": parallel.world_size,
        "pp_size": parallel.pp_size,
        "pcp_size": parallel.pcp_size,
        "dcp_size": parallel.dcp_size,
        "replicated_layout": bool(config.replicated_layout),
        "canonical_layout": bool(config.canonical_layout),
        "key_format": KEY_FORMAT,
    }


def _require(ok: bool, key: str, message: str) -> None:
    if not ok:
        raise ConfigError(f"LMDBTier option {key!r}: {message}")


def _path(key: str, value: object) -> Path:
    if not isinstance(value, str | os.PathLike) or not str(value):
        raise ConfigError(f"LMDBTier option {key!r}: expected a directory path, got {value!r}")
    return Path(os.path.expanduser(os.fspath(value)))


def _size(key: str, value: object) -> int:
    try:
        return parse_size(key, value)
    except ConfigError as exc:
        raise ConfigError(
            f"LMDBTier option {key!r}: expected a size in bytes (e.g. 107374182400 or '100GiB'), "
            f"got {value!r}"
        ) from exc


def _int(key: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ConfigError(f"LMDBTier option {key!r}: expected an integer, got {value!r}")
    try:
        return int(value)
    except ValueError as exc:
        raise ConfigError(f"LMDBTier option {key!r}: expected an integer, got {value!r}") from exc


def _optional_int(key: str, value: object) -> int | None:
    return None if value is None else _int(key, value)


def _float(key: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ConfigError(f"LMDBTier option {key!r}: expected a number, got {value!r}")
    try:
        return float(value)
    except ValueError as exc:
        raise ConfigError(f"LMDBTier option {key!r}: expected a number, got {value!r}") from exc


def _str(key: str, value: object) -> str:
    if not isinstance(value, str):
        raise ConfigError(f"LMDBTier option {key!r}: expected a string, got {value!r}")
    return value


def _lower_str(key: str, value: object) -> str:
    return _str(key, value).lower()


def _optional_upper_str(key: str, value: object) -> str | None:
    return None if value is None else _str(key, value).upper()


def _bool(key: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"LMDBTier option {key!r}: expected true or false, got {value!r}")
    return value


_PARSERS: dict[str, Callable[[str, Any], Any]] = {
    "path": _path,
    "capacity_bytes": _size,
    "eviction_policy": _lower_str,
    "num_read_threads": _int,
    "namespace_salt": _str,
    "enable_kv_events": _bool,
    "locality": _optional_upper_str,
    "metrics_port": _optional_int,
    "metrics_host": _str,
    "shutdown_timeout_s": _float,
}
