"""Chunk keys and tier names.

A chunk's key is vLLM's prefix-cache hash of the chunk's last engine block: content-addressed and
chained, so it covers the whole prefix (and LoRA, multimodal inputs, cache salt).
"""

from __future__ import annotations

from enum import StrEnum
from typing import NewType

__all__ = ["BlockKey", "Tier", "group_key", "short_hex", "split_group_key"]

BlockKey = NewType("BlockKey", bytes)


class Tier(StrEnum):
    """The tiers kvstore manages (the engine's own KV cache is vLLM's)."""

    CPU = "cpu"
    DISK = "disk"
    REMOTE = "remote"  # a Redis / Redis Cluster shared by many engines


def short_hex(key: bytes, length: int = 12) -> str:
    """A key as short hex, for logs and tables."""
    return key.hex()[:length]


def group_key(key: bytes, group: int, num_groups: int) -> BlockKey:
    """The key of KV cache group `group`'s share of a chunk. An engine with one group (no
    hybrid KV cache manager) uses the chunk key itself; a hybrid one stores each group's layers
    as their own entry, keyed by the chunk key and one byte naming the group, so a group's
    chunk is only ever found for that same group, and the chunk key (vLLM's block hash, which
    its KV events publish) and the group read back out of it (`split_group_key`)."""
    if num_groups == 1:
        return BlockKey(key)
    if not 0 <= group < 256:
        raise ValueError(f"KV cache group {group} out of range 0..255")
    return BlockKey(key + bytes((group,)))


def split_group_key(key: bytes) -> tuple[BlockKey, int]:
    """A hybrid engine's entry key -> (chunk key, KV cache group)."""
    return BlockKey(key[:-1]), key[-1]
