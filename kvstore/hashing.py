"""Chained chunk keys over token ids, like vLLM's prefix-cache hash (for simulation and tests).

Each key is sha256(parent key + the chunk's token ids), so a key covers its whole prefix: two
prompts share a key exactly when they share every token up to the end of that chunk. Only full
chunks get a key. Real engines hash more (LoRA, multimodal inputs, cache salt); these keys are
for replaying traces, not for matching an engine's own keys.
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Sequence

from kvstore.keys import BlockKey

__all__ = ["chunk_keys"]

_ROOT = b"kvstore-chunk-keys-v1"


def chunk_keys(
    token_ids: Sequence[int], num_tokens_per_chunk: int, *, parent_key: bytes = _ROOT
) -> list[BlockKey]:
    """The keys of the full chunks of `token_ids`, in prefix order.

    `parent_key` seeds the chain (pass the key of the chunk before `token_ids[0]` to continue one).
    """
    if num_tokens_per_chunk < 1:
        raise ValueError(f"num_tokens_per_chunk must be >= 1, got {num_tokens_per_chunk}")
    keys: list[BlockKey] = []
    parent = parent_key
    num_full_tokens = len(token_ids) - len(token_ids) % num_tokens_per_chunk
    for start in range(0, num_full_tokens, num_tokens_per_chunk):
        chunk = array("q", token_ids[start : start + num_tokens_per_chunk])
        parent = hashlib.sha256(parent + chunk.tobytes()).digest()
        keys.append(BlockKey(parent))
    return keys
