"""What kvstore needs to know about the engine, read from vLLM's config on either side.

Both roles compute the same geometry from the same config, so the scheduler can size and
create the CPU region before any worker has attached to it, and the worker can check that its
KV tensors match what the scheduler planned for.
"""

from __future__ import annotations

import os
import platform
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

import kvstore
from kvstore.config import KVStoreConfig
from kvstore.errors import ConfigError
from kvstore.namespace import NamespaceDescriptor

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.kv_cache_interface import KVCacheConfig

__all__ = ["EngineGeometry", "KVGroup"]

FULL, SLIDING = "full", "sliding"


@dataclass(frozen=True, slots=True)
class KVGroup:
    """One of vLLM's KV cache groups as kvstore stores it: `kind` is `full` (every chunk of a
    prefix is needed) or `sliding` (a hit needs only the chunks within `window_tokens` before
    it); each group's share of a chunk is its own entry in kvstore's tiers (`group_key`)."""

    index: int
    kind: str
    window_tokens: int
    layer_names: tuple[str, ...]
    spec_kind: str = ""  # vLLM's name of the group's kind, as its KV events carry it

    def window_chunks(self, chunk_tokens: int) -> int:
        """Chunks before a hit boundary this group needs (0: all of them). The token computed
        next at boundary t attends to tokens t - window + 1 .. t - 1."""
        if self.kind == FULL:
            return 0
        return -(-(self.window_tokens - 1) // chunk_tokens)


@dataclass(frozen=True, slots=True)
class EngineGeometry:
    engine_id: str
    model: str
    kv_dtype: str
    engine_block_size: int  # tokens per engine block
    hash_block_size: int  # tokens per entry of request.block_hashes
    blocks_per_chunk: int
    tp_size: int
    num_engine_blocks: int
    layer_names: tuple[str, ...]
    layer_block_bytes: tuple[int, ...]  # one engine block of each layer, one rank
    device_type: str
    attention_backend: str
    kv_cache_layout: str
    hash_algo: str
    is_hash_stable: bool  # keys reproducible across restarts
    # Sliding-window / chunked-local layers that vLLM allocates as full attention because its
    # hybrid KV cache manager is off (see `local_attention`), and their window in tokens.
    num_local_layers: int = 0
    local_window_tokens: int = 0
    # vLLM's KV cache groups (one unless its hybrid KV cache manager is on): a CPU row holds one
    # group's layers of one chunk, so every group must have the same bytes per block.
    groups: tuple[KVGroup, ...] = ()

    @property
    def num_groups(self) -> int:
        return max(1, len(self.groups))

    @property
    def is_hybrid(self) -> bool:
        """vLLM's hybrid KV cache manager is on: several groups, keyed apart."""
        return self.num_groups > 1

    def group_layer_names(self, group: int) -> tuple[str, ...]:
        return self.groups[group].layer_names if self.groups else self.layer_names

    @property
    def num_tokens_per_chunk(self) -> int:
        return self.engine_block_size * self.blocks_per_chunk

    @property
    def hashes_per_chunk(self) -> int:
        return self.num_tokens_per_chunk // self.hash_block_size

    @property
    def slice_bytes(self) -> int:
        """One rank's share of a chunk of one group: every layer's blocks of the chunk (all
        layers when there is one group; a hybrid engine's groups are equal in size)."""
        num_layers = len(self.group_layer_names(0))
        return sum(self.layer_block_bytes[:num_layers]) * self.blocks_per_chunk

    @property
    def row_bytes(self) -> int:
        """A CPU row / disk value: every rank's slice, rank r at `r * slice_bytes`."""
        return self.slice_bytes * self.tp_size

    @property
    def region_name(self) -> str:
        return f"kvstore-{self.engine_id}"

    @classmethod
    def from_vllm(
        cls, vllm_config: VllmConfig, kv_cache_config: KVCacheConfig, config: KVStoreConfig
    ) -> EngineGeometry:
        groups = kv_cache_config.kv_cache_groups
        kv_groups = _kv_groups(groups) if len(groups) > 1 else ()
        parallel = vllm_config.parallel_config
        if parallel.pipeline_parallel_size != 1:
            raise ConfigError("KVStoreConnector supports pipeline_parallel_size == 1 only")
        spec = groups[0].kv_cache_spec
        engine_block_size = int(spec.block_size)
        hash_block_size = int(
            getattr(kv_cache_config, "hash_block_size", None) or vllm_config.cache_config.block_size
        )
        block_size = _chunk_tokens(config.block_size, engine_block_size, hash_block_size)
        layer_names = tuple(name for group in groups for name in group.layer_names)
        cache_config = vllm_config.cache_config
        hash_algo = str(cache_config.prefix_caching_hash_algo)
        return cls(
            engine_id=str(vllm_config.kv_transfer_config.engine_id)  # type: ignore[union-attr]
            if vllm_config.kv_transfer_config is not None
            else "default",
            model=str(vllm_config.model_config.model),
            kv_dtype=str(getattr(spec, "dtype", "unknown")).removeprefix("torch."),
            engine_block_size=engine_block_size,
            hash_block_size=hash_block_size,
            blocks_per_chunk=block_size // engine_block_size,
            tp_size=int(parallel.tensor_parallel_size),
            num_engine_blocks=int(kv_cache_config.num_blocks),
            layer_names=layer_names,
            layer_block_bytes=tuple(
                _page_bytes(group.kv_cache_spec) for group in groups for _ in group.layer_names
            ),
            device_type=_device_type(),
            attention_backend=_attention_backend(vllm_config),
            kv_cache_layout=str(getattr(kv_cache_config, "kv_cache_layout", None) or "default"),
            hash_algo=hash_algo,
            is_hash_stable=_is_hash_stable(hash_algo),
            groups=kv_groups,
            **(local_attention(spec, getattr(vllm_config.model_config.hf_text_config,
                                             "layer_types", None)) if not kv_groups else {}),
        )  # fmt: skip

    def namespace(self, config: KVStoreConfig) -> NamespaceDescriptor:
        return NamespaceDescriptor(
            model=self.model,
            kv_dtype=self.kv_dtype,
            engine_block_size=self.engine_block_size,
            blocks_per_chunk=self.blocks_per_chunk,
            tp_size=self.tp_size,
            device_type=self.device_type,
            attention_backend=self.attention_backend,
            hash_algo=self.hash_algo,
            row_bytes=self.row_bytes,
            layout=self.spec_summary(),
            salt=config.namespace_salt,
            created_by=f"kvstore {kvstore.__version__}",
        )

    def spec_summary(self) -> dict[str, Any]:
        summary: dict[str, Any] = {
            "kv_cache_layout": self.kv_cache_layout,
            "layers": list(self.layer_names),
            "layer_block_bytes": list(self.layer_block_bytes),
        }
        if self.is_hybrid:  # a row holds one group's layers
            summary["groups"] = [
                {"kind": g.kind, "window_tokens": g.window_tokens, "layers": list(g.layer_names)}
                for g in self.groups
            ]
        return summary


def _kv_groups(groups: Any) -> tuple[KVGroup, ...]:
    """The KV cache groups of an engine whose hybrid KV cache manager is on, checked: full
    attention and sliding-window groups, one block size, equal bytes per block."""
    from vllm.v1.kv_cache_interface import FullAttentionSpec, SlidingWindowSpec

    kv_groups = []
    for index, group in enumerate(groups):
        spec = group.kv_cache_spec
        if isinstance(spec, SlidingWindowSpec):
            kind, window = SLIDING, int(spec.sliding_window)
        elif isinstance(spec, FullAttentionSpec) and not (
            getattr(spec, "sliding_window", None) or getattr(spec, "attention_chunk_size", None)
        ):
            kind, window = FULL, 0
        else:
            raise ConfigError(
                f"KVStoreConnector supports full-attention and sliding-window KV cache groups; "
                f"group {index} ({', '.join(group.layer_names[:2])}...) is "
                f"{type(spec).__name__}, which it cannot store (README, Limits)"
            )
        kv_groups.append(KVGroup(index, kind, window, tuple(group.layer_names), _spec_kind(spec)))
    specs = [group.kv_cache_spec for group in groups]
    block_sizes = {int(spec.block_size) for spec in specs}
    group_bytes = {
        _page_bytes(spec) * len(group.layer_names)
        for spec, group in zip(specs, groups, strict=True)
    }
    if len(block_sizes) != 1 or len(group_bytes) != 1:
        raise ConfigError(
            "KVStoreConnector needs every KV cache group to have the same block size and bytes "
            f"per block; this engine's groups have block sizes {sorted(block_sizes)} and "
            f"{sorted(group_bytes)} bytes per block (README, Limits)"
        )
    return tuple(kv_groups)


_LOCAL_LAYER_TYPES = frozenset({"sliding_attention", "chunked_attention"})


def local_attention(spec: object, layer_types: object = None) -> dict[str, int]:
    """The sliding-window and chunked-local layers of a single KV cache group: vLLM turned
    their specs into full attention (its hybrid manager is off) and kept the window on them
    (`sliding_window` / `attention_chunk_size`). A uniform-type group lists its layers' specs;
    a merged spec only says that some layer has a window, so the count comes from the model's
    `layer_types` where its config has them (else: at least 1)."""
    per_layer = getattr(spec, "kv_cache_specs", None)
    specs = list(per_layer.values()) if isinstance(per_layer, dict) else [spec]
    windows = [
        int(window)
        for layer_spec in specs
        if (window := getattr(layer_spec, "sliding_window", None)
            or getattr(layer_spec, "attention_chunk_size", None))
    ]  # fmt: skip
    num_local = len(windows)
    if windows and isinstance(layer_types, list | tuple):
        num_local = max(1, sum(kind in _LOCAL_LAYER_TYPES for kind in layer_types))
    return {"num_local_layers": num_local, "local_window_tokens": max(windows, default=0)}


def _spec_kind(spec: Any) -> str:
    """vLLM's `KVCacheSpecKind` of a spec ("" where this vLLM has none)."""
    try:
        from vllm.v1.kv_cache_interface import get_kv_cache_spec_kind
    except ImportError:
        return ""
    return str(get_kv_cache_spec_kind(spec).value)


def _page_bytes(spec: Any) -> int:
    return int(getattr(spec, "unpadded_page_size_bytes", None) or spec.page_size_bytes)


def _chunk_tokens(configured: int | None, engine_block_size: int, hash_block_size: int) -> int:
    """Tokens per chunk: `block_size` from the config (default: the engine's), checked."""
    block_size = configured or engine_block_size
    if block_size % engine_block_size != 0:
        raise ConfigError(
            f"block_size: {block_size} tokens per chunk is not a multiple of the engine's "
            f"block size ({engine_block_size})"
        )
    if block_size % hash_block_size != 0:
        raise ConfigError(
            f"block_size: {block_size} is not a multiple of the prefix-hash block size "
            f"({hash_block_size})"
        )
    return block_size


def _device_type() -> str:
    from vllm.platforms import current_platform

    device = str(current_platform.device_type)
    if device == "cpu":  # the CPU backend packs K in an ISA-dependent way
        return f"cpu-{platform.machine()}-{torch.backends.cpu.get_cpu_capability()}"
    if device == "cuda" and torch.cuda.is_available():
        major, minor = torch.cuda.get_device_capability()
        return f"cuda-sm{major}{minor}"
    return device


def _attention_backend(vllm_config: VllmConfig) -> str:
    backend = getattr(getattr(vllm_config, "attention_config", None), "backend", None)
    return str(getattr(backend, "name", backend) or "auto")


def _is_hash_stable(hash_algo: str) -> bool:
    """sha256 chains start from a fixed seed; xxhash ones from random bytes unless PYTHONHASHSEED
    is set (vllm/v1/core/kv_cache_utils.py: resolve_none_hash_seed, in the pinned vLLM)."""
    return "xxhash" not in hash_algo or os.getenv("PYTHONHASHSEED") is not None
