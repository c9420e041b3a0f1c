"""`LMDBTier`'s options (the keys of its `secondary_tiers` entry) and its namespace.

Every option is checked when vLLM builds the tier, by the parsers `KVStoreConnector`'s config uses
too (`kvstore.options`); a bad or unknown key stops the engine with a `ConfigError` naming the key
and what is allowed. The namespace fingerprints what vLLM's `OffloadingConfig` says about the
bytes of one primary slot (model, KV dtype, groups, layers, chunk and hash sizes, parallelism,
host layout) plus the slot size and the device type, so an engine that would read the bytes
differently never sees them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

import kvstore
from kvstore.errors import ConfigError
from kvstore.namespace import NamespaceDescriptor
from kvstore.options import (
    Parser,
    check_choice,
    check_keys,
    parse_bool,
    parse_float,
    parse_int,
    parse_lower_str,
    parse_optional_int,
    parse_optional_upper_str,
    parse_path,
    parse_size,
    parse_str,
    parse_text,
    parse_values,
    require,
)
from kvstore.policies import POLICY_NAMES

if TYPE_CHECKING:
    from vllm.v1.kv_offload.config import OffloadingConfig

__all__ = ["KEY_FORMAT", "LMDBTierOptions", "option_label", "tier_descriptor"]

KEY_FORMAT = "vllm_offload_key"
"""What the store's keys are: vLLM `OffloadKey`s (block hash + 4-byte big-endian group index)."""

_LOCALITIES = ("LOCAL", "REMOTE")
_WHAT = "LMDBTier option(s)"


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
        known = [f.name for f in fields(cls)]
        check_keys(options, known, _WHAT)
        for required in ("path", "capacity_bytes"):
            if options.get(required) is None:
                raise ConfigError(f"{option_label(required)} is required")
        values = parse_values(options, _PARSERS, known=known, what=_WHAT, label=option_label)
        parsed = cls(**values)
        parsed.validate()
        return parsed

    def validate(self) -> None:
        label = option_label
        require(self.capacity_bytes > 0, label("capacity_bytes"), f"got {self.capacity_bytes}")
        check_choice(label("eviction_policy"), self.eviction_policy, POLICY_NAMES)
        require(1 <= self.num_read_threads <= 64, label("num_read_threads"), "must be in 1..64")
        if self.locality is not None:
            check_choice(label("locality"), self.locality, _LOCALITIES)
        if self.metrics_port is not None:
            require(0 <= self.metrics_port <= 65535, label("metrics_port"), "must be in 0..65535")
        require(self.shutdown_timeout_s > 0, label("shutdown_timeout_s"), "must be > 0 seconds")


def option_label(key: str) -> str:
    """How errors name an option: "LMDBTier option 'capacity_bytes'"."""
    return f"LMDBTier option {key!r}"


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


_PARSERS: dict[str, Parser] = {
    "path": parse_path,
    "capacity_bytes": parse_size,
    "eviction_policy": parse_lower_str,
    "num_read_threads": parse_int,
    "namespace_salt": parse_text,
    "enable_kv_events": parse_bool,
    "locality": parse_optional_upper_str,
    "metrics_port": parse_optional_int,
    "metrics_host": parse_str,
    "shutdown_timeout_s": parse_float,
}
