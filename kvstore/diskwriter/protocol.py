"""The messages between the engine and its disk-writer process (msgpack, one per frame).

Setup (engine -> child, once): `Setup`. Answer: `["ready", pid, [applied priority steps]]` or
`["failed", message]`. Then requests, each answered once, in order:

- `["put", namespace, [[key, row], ...], now_s]` -> `["ok", bytes written]`
- `["delete", namespace, [key, ...]]` -> `["ok", number deleted]`
- `["touch", namespace, [key, ...], now_s]` -> `["ok", None]`
- `["sync"]` -> `["ok", None]`
- `["close"]` -> `["ok", None]` once synced; the child then closes the store and exits (end of
  input does the same: a process forked from the engine may hold the engine's end open)

A failure answers `["full", message, requested_bytes, free_bytes]` (`StoreFullError`),
`["io", message]` (any other `TierError` or `OSError`: the disk failed) or `["bug", message]`
(anything else: a defect, logged with its traceback in the child). End of input ends the child.
"""

from __future__ import annotations

from typing import Any

import msgspec

__all__ = ["Setup", "decode", "decode_setup", "encode"]


class Setup(msgspec.Struct, frozen=True, array_like=True):
    """What the child opens: the LMDB store (as the engine opened it) and the region file;
    `writemap`: LMDB writes through its map (see `kvstore.diskwriter.child`)."""

    store_path: str
    capacity_bytes: int
    region_path: str
    lower_priority: bool = True
    writemap: bool = True


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder()


def encode(message: Any) -> bytes:
    return _encoder.encode(message)


def decode(data: bytes) -> Any:
    return _decoder.decode(data)


def decode_setup(data: bytes) -> Setup:
    return msgspec.msgpack.decode(data, type=Setup)
