"""Chunk keys and tier names.

A chunk's key is vLLM's prefix-cache hash of the chunk's last engine block: content-addressed and
chained, so it covers the whole prefix (and LoRA, multimodal inputs, cache salt).
"""

from __future__ import annotations

from enum import StrEnum
from typing import NewType

__all__ = ["BlockKey", "Tier", "short_hex"]

BlockKey = NewType("BlockKey", bytes)


class Tier(StrEnum):
    """The tiers kvstore manages (the engine's own KV cache is vLLM's)."""

    CPU = "cpu"
    DISK = "disk"
    REMOTE = "remote"  # a Redis / Redis Cluster shared by many engines


def short_hex(key: bytes, length: int = 12) -> str:
    """A key as short hex, for logs and tables."""
    return key.hex()[:length]
