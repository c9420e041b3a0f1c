"""vLLM's KV-events wire format, mirrored with our own msgspec structs (no vLLM import).

Same tag names, field order and options as `vllm.distributed.kv_events` (vLLM 0.32): a batch is
an array `[ts, events]` or `[ts, events, dp_rank]` (`array_like`, `omit_defaults`), each event a
tagged map (`{"type": "BlockStored", ...}`). A ZMQ message is three frames: topic, an 8-byte
big-endian sequence number, the msgpack batch. A stock vLLM subscriber decodes what we publish,
and `kvstore watch` decodes what vLLM publishes.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from typing import Any

import msgspec

from kvstore.errors import RecordError
from kvstore.events import ChunkStored, TierEvent
from kvstore.keys import Tier

__all__ = [
    "AllBlocksCleared",
    "BlockRemoved",
    "BlockStored",
    "END_SEQ",
    "EventBatch",
    "ExternalBlockHash",
    "KVCacheEvent",
    "KVEventBatch",
    "LOCALITY_BY_TIER",
    "MEDIUM_BY_TIER",
    "block_hash_to_wire",
    "decode_batch",
    "encode_batch",
    "int_block_hashes_from_env",
    "to_wire_events",
]

ExternalBlockHash = bytes | int
"""A block hash on the wire: the raw hash bytes, or its low 64 bits as an int."""

MEDIUM_BY_TIER: dict[Tier, str] = {Tier.CPU: "CPU", Tier.DISK: "STORAGE", Tier.REMOTE: "STORAGE"}
"""The `medium` vLLM's own offloading tiers use for each of our tiers."""

LOCALITY_BY_TIER: dict[Tier, str] = {Tier.REMOTE: "REMOTE"}
"""vLLM's `locality` (storage relative to the publishing instance) where it tells tiers apart:
the shared remote tier is STORAGE like the local disk, and REMOTE (vLLM's `Locality.REMOTE`)."""

END_SEQ = (-1).to_bytes(8, "big", signed=True)
"""The sequence frame that ends a replay answer."""


class EventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[Any]
    data_parallel_rank: int | None = None


class KVCacheEvent(msgspec.Struct, omit_defaults=True, gc=False, tag=True):
    """Base of the tagged events (the tag is the class name)."""


class BlockStored(KVCacheEvent):
    block_hashes: list[ExternalBlockHash]
    parent_block_hash: ExternalBlockHash | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list[tuple[Any, ...] | None] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None
    locality: str | None = None
    ownership: str | None = None
    session_id: str | None = None


class BlockRemoved(KVCacheEvent):
    block_hashes: list[ExternalBlockHash]
    medium: str | None
    group_idx: int | None = None
    locality: str | None = None
    ownership: str | None = None


class AllBlocksCleared(KVCacheEvent):
    pass


class KVEventBatch(EventBatch):
    events: list[BlockStored | BlockRemoved | AllBlocksCleared]


def int_block_hashes_from_env() -> bool:
    """Whether vLLM would publish 64-bit int hashes (`VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES`).

    vLLM 0.32 defaults the variable to "1" (ints); "0" publishes the hash bytes.
    """
    return bool(int(os.environ.get("VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES", "1")))


def block_hash_to_wire(key: bytes, *, int_hashes: bool) -> ExternalBlockHash:
    """The hash as vLLM's `maybe_convert_block_hash` writes it: bytes, or the low 64 bits."""
    if not int_hashes:
        return bytes(key)
    return int.from_bytes(key, byteorder="big") & ((1 << 64) - 1)


def _to_wire(event: TierEvent, int_hashes: bool) -> BlockStored | BlockRemoved:
    hashes = [block_hash_to_wire(k, int_hashes=int_hashes) for k in event.keys]
    medium = MEDIUM_BY_TIER[Tier(event.tier)]
    locality = LOCALITY_BY_TIER.get(Tier(event.tier))
    if isinstance(event, ChunkStored):
        parent = event.parent_key
        return BlockStored(
            block_hashes=hashes,
            parent_block_hash=None
            if parent is None
            else block_hash_to_wire(parent, int_hashes=int_hashes),
            token_ids=list(event.token_ids or ()),
            block_size=event.num_tokens_per_chunk,
            lora_id=None,
            medium=medium,
            lora_name=None,
            locality=locality,
        )
    return BlockRemoved(block_hashes=hashes, medium=medium, locality=locality)


def to_wire_events(
    events: Sequence[TierEvent], *, int_hashes: bool
) -> Iterator[BlockStored | BlockRemoved]:
    """Internal events as vLLM's events: one wire event per internal event, chunks as blocks.

    `block_size` is the tokens per chunk (a chunk is one block to a subscriber).
    """
    for event in events:
        yield _to_wire(event, int_hashes)


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(KVEventBatch)


def encode_batch(
    events: Sequence[BlockStored | BlockRemoved | AllBlocksCleared],
    *,
    ts: float,
    dp_rank: int | None = None,
) -> bytes:
    return _encoder.encode(KVEventBatch(ts=ts, events=list(events), data_parallel_rank=dp_rank))


def decode_batch(payload: bytes) -> KVEventBatch:
    """Decode one batch; raises `RecordError` (a `ValueError`) on a malformed one, including
    one nested too deeply to decode."""
    try:
        return _decoder.decode(payload)
    except (msgspec.DecodeError, RecursionError) as exc:
        raise RecordError(
            f"malformed KV-event batch ({len(payload)} bytes): {str(exc)[:200]}"
        ) from exc
