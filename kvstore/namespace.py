"""Namespaces: everything that makes stored bytes interchangeable, fingerprinted.

Two engines may share stored chunks only when their namespace ids match: same format version,
model, KV dtype, per-layer KV layout and shapes, engine block size, chunk size, TP size, device
type and attention backend (the CPU backend packs K in an ISA-dependent way). The descriptor is
stored beside the data so the CLI can decode chunks and a mismatched engine never reads them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import xxhash

__all__ = ["FORMAT_VERSION", "NamespaceDescriptor", "namespace_id"]

FORMAT_VERSION = 1


@dataclass(frozen=True, slots=True)
class NamespaceDescriptor:
    """What a chunk's bytes mean. JSON-safe; `layout` is `tiers.paged.ChunkLayout.to_dict()`."""

    model: str
    kv_dtype: str
    engine_block_size: int
    blocks_per_chunk: int
    tp_size: int
    device_type: str
    attention_backend: str
    hash_algo: str
    row_bytes: int
    layout: Mapping[str, Any]
    salt: str = ""
    format_version: int = FORMAT_VERSION
    created_by: str = field(default="", compare=False)

    @property
    def num_tokens_per_chunk(self) -> int:
        return self.engine_block_size * self.blocks_per_chunk

    def fingerprint_fields(self) -> dict[str, Any]:
        """The fields that define compatibility (everything but provenance)."""
        data = asdict(self)
        data.pop("created_by")
        data["layout"] = dict(self.layout)
        return data

    def to_dict(self) -> dict[str, Any]:
        data = self.fingerprint_fields()
        data["created_by"] = self.created_by
        data["namespace_id"] = namespace_id(self)
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> NamespaceDescriptor:
        names = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in data.items() if k in names})


def namespace_id(descriptor: NamespaceDescriptor) -> str:
    """A short stable id: xxh64 of the canonical JSON of the compatibility fields."""
    canonical = json.dumps(descriptor.fingerprint_fields(), sort_keys=True, separators=(",", ":"))
    return xxhash.xxh64_hexdigest(canonical.encode())
