"""Namespaces: everything that makes stored bytes interchangeable, fingerprinted.

Two engines may share stored chunks only when their namespace ids match: same format version,
model, KV dtype, per-layer KV layout and shapes, engine block size, chunk size, TP size, device
type and attention backend (the CPU backend packs K in an ISA-dependent way). The descriptor is
stored beside the data so the CLI can decode chunks and a mismatched engine never reads them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import MISSING, asdict, dataclass, field
from typing import Any

import xxhash

from kvstore.errors import RecordError

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
        """The descriptor `to_dict` (or a store) holds; other keys are ignored. Raises
        RecordError, naming the field, for a missing field or a value of the wrong type."""
        if not isinstance(data, Mapping):
            raise RecordError(f"namespace descriptor must be a mapping, got {data!r:.80}")
        values: dict[str, Any] = {}
        for name, spec in cls.__dataclass_fields__.items():
            if name not in data:
                if spec.default is MISSING:
                    raise RecordError(f"namespace descriptor has no {name!r} field")
                continue
            values[name] = _checked(name, data[name])
        try:
            json.dumps(dict(values["layout"]), sort_keys=True)
        except (TypeError, ValueError, RecursionError) as exc:
            raise RecordError(
                f"namespace descriptor field 'layout' is not plain JSON: {exc}"
            ) from exc
        return cls(**values)


_FIELD_TYPES: dict[str, type] = {
    "model": str,
    "kv_dtype": str,
    "engine_block_size": int,
    "blocks_per_chunk": int,
    "tp_size": int,
    "device_type": str,
    "attention_backend": str,
    "hash_algo": str,
    "row_bytes": int,
    "layout": Mapping,
    "salt": str,
    "format_version": int,
    "created_by": str,
}


def _checked(name: str, value: object) -> Any:
    expected = _FIELD_TYPES[name]
    if not isinstance(value, expected) or (expected is int and isinstance(value, bool)):
        raise RecordError(
            f"namespace descriptor field {name!r} must be {expected.__name__}, got {value!r:.80}"
        )
    return value


def namespace_id(descriptor: NamespaceDescriptor) -> str:
    """A short stable id: xxh64 of the canonical JSON of the compatibility fields."""
    canonical = json.dumps(descriptor.fingerprint_fields(), sort_keys=True, separators=(",", ":"))
    return xxhash.xxh64_hexdigest(canonical.encode())
