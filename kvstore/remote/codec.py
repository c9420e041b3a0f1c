"""The remote tier's keys and value format.

Keys carry the namespace, so engines whose bytes are not interchangeable never read each other's
values:

    kvstore:<namespace id>:<chunk key hex>      one chunk (value below)
    kvstore:<namespace id>:descriptor           the namespace descriptor, JSON (written once)

A value is a fixed 40-byte little-endian header followed by the raw payload (plain bytes: no
object serialization, so nothing in a value can run code when it is read):

    offset size  field
    0      4     magic b"KVSR"
    4      2     value format version (VALUE_FORMAT_VERSION)
    6      2     flags (0; reserved)
    8      8     namespace id (the 16 hex digits as 8 bytes)
    16     8     payload size in bytes
    24     8     xxh64 of the chunk key (a value copied under another key is caught)
    32     8     xxh64 of the payload (seed 0, as the LMDB tier)
    40     ...   payload

`decode`/`decode_into` verify everything: a size or checksum mismatch raises
`RemoteCorruptError`; bad magic, another namespace or key raise `RemoteFormatError`; a newer
format raises `RemoteVersionError`.
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass

import xxhash

from kvstore.keys import BlockKey
from kvstore.remote.errors import RemoteCorruptError, RemoteFormatError, RemoteVersionError

__all__ = [
    "HEADER",
    "KEY_PREFIX",
    "MAGIC",
    "VALUE_FORMAT_VERSION",
    "ValueHeader",
    "chunk_key",
    "decode",
    "decode_into",
    "descriptor_key",
    "encode",
    "namespace_pattern",
    "parse_chunk_key",
    "read_header",
    "split_key",
]

MAGIC = b"KVSR"
VALUE_FORMAT_VERSION = 1
HEADER = struct.Struct("<4sHH8sQQQ")
KEY_PREFIX = b"kvstore:"
_DESCRIPTOR = b"descriptor"
_NAMESPACE_ID = re.compile(r"[0-9a-f]{16}")
_CHUNK_HEX = re.compile(rb"(?:[0-9a-f]{2})+")


@dataclass(frozen=True, slots=True)
class ValueHeader:
    """A value's header, as read (not yet verified against a namespace or key)."""

    version: int
    flags: int
    namespace_id: str
    payload_bytes: int
    key_xxh64: int
    payload_xxh64: int


def _namespace_bytes(namespace_id: str) -> bytes:
    if not _NAMESPACE_ID.fullmatch(namespace_id):
        raise ValueError(f"namespace id must be 16 lowercase hex digits, got {namespace_id!r}")
    return bytes.fromhex(namespace_id)


def chunk_key(namespace_id: str, key: bytes) -> bytes:
    """The Redis key of one chunk: `kvstore:<namespace>:<key hex>`."""
    _namespace_bytes(namespace_id)
    if not key:
        raise ValueError("a chunk key must not be empty")
    return b"%s%s:%s" % (KEY_PREFIX, namespace_id.encode(), key.hex().encode())


def descriptor_key(namespace_id: str) -> bytes:
    """The Redis key of a namespace's descriptor."""
    _namespace_bytes(namespace_id)
    return b"%s%s:%s" % (KEY_PREFIX, namespace_id.encode(), _DESCRIPTOR)


def namespace_pattern(namespace_id: str | None = None) -> bytes:
    """A SCAN MATCH pattern for every key of a namespace (of every namespace when None)."""
    if namespace_id is None:
        return KEY_PREFIX + b"*"
    _namespace_bytes(namespace_id)
    return b"%s%s:*" % (KEY_PREFIX, namespace_id.encode())


def split_key(redis_key: bytes) -> tuple[str, BlockKey | None] | None:
    """`(namespace id, chunk key)` of a kvstore key, `(namespace id, None)` for a descriptor,
    None for anything else."""
    if not redis_key.startswith(KEY_PREFIX):
        return None
    namespace, sep, rest = redis_key[len(KEY_PREFIX) :].partition(b":")
    if not sep or not _NAMESPACE_ID.fullmatch(namespace.decode("ascii", "replace")):
        return None
    if rest == _DESCRIPTOR:
        return namespace.decode(), None
    if not _CHUNK_HEX.fullmatch(rest):
        return None
    return namespace.decode(), BlockKey(bytes.fromhex(rest.decode()))


def parse_chunk_key(namespace_id: str, redis_key: bytes) -> BlockKey | None:
    """The chunk key of one of `namespace_id`'s chunk keys; None for anything else."""
    parts = split_key(redis_key)
    if parts is None or parts[0] != namespace_id:
        return None
    return parts[1]


def encode(namespace_id: str, key: bytes, payload: bytes | bytearray | memoryview) -> bytes:
    """Header + payload, in one bytes object (one copy of the payload)."""
    view = memoryview(payload).cast("B")
    header = HEADER.pack(
        MAGIC,
        VALUE_FORMAT_VERSION,
        0,
        _namespace_bytes(namespace_id),
        view.nbytes,
        xxhash.xxh64_intdigest(key),
        xxhash.xxh64_intdigest(view),
    )
    return b"".join((header, view))


def read_header(value: bytes | bytearray | memoryview) -> ValueHeader:
    """The header of a stored value; `RemoteFormatError` when it is not a kvstore value,
    `RemoteCorruptError` when it is one cut short, `RemoteVersionError` when it is newer."""
    view = memoryview(value).cast("B")
    if view[: len(MAGIC)] != MAGIC:
        raise RemoteFormatError(
            f"not a kvstore value: starts with {bytes(view[:8])!r}, expected magic {MAGIC!r}"
        )
    if view.nbytes < HEADER.size:
        raise RemoteCorruptError(
            f"value truncated to {view.nbytes} bytes, shorter than the {HEADER.size}-byte header"
        )
    _, version, flags, namespace, size, key_digest, digest = HEADER.unpack_from(view)
    if version > VALUE_FORMAT_VERSION:
        raise RemoteVersionError(
            f"value format version {version} is newer than this kvstore's "
            f"{VALUE_FORMAT_VERSION}: upgrade kvstore to read it"
        )
    if version < 1:
        raise RemoteFormatError(f"value format version {version} is invalid (expected >= 1)")
    return ValueHeader(version, flags, namespace.hex(), size, key_digest, digest)


def decode(namespace_id: str, key: bytes, value: bytes | bytearray | memoryview) -> memoryview:
    """The verified payload of `value` stored under `namespace_id`/`key` (a view, no copy)."""
    view = memoryview(value).cast("B")
    header = read_header(view)
    if header.namespace_id != namespace_id:
        raise RemoteFormatError(
            f"value of namespace {header.namespace_id} stored under namespace {namespace_id}"
        )
    if header.key_xxh64 != xxhash.xxh64_intdigest(key):
        raise RemoteFormatError(f"value of another chunk stored under key {key.hex()[:12]}")
    payload = view[HEADER.size :]
    if payload.nbytes != header.payload_bytes:
        raise RemoteCorruptError(
            f"payload is {payload.nbytes} bytes, its header says {header.payload_bytes}"
        )
    digest = xxhash.xxh64_intdigest(payload)
    if digest != header.payload_xxh64:
        raise RemoteCorruptError(
            f"payload xxh64 {digest:016x} does not match its header's {header.payload_xxh64:016x}"
        )
    return payload


def decode_into(
    namespace_id: str, key: bytes, value: bytes | bytearray | memoryview, out: memoryview
) -> int:
    """Verify `value` and copy its payload into `out`, which it must fill exactly; returns the
    number of bytes written. A payload of another size raises `RemoteFormatError`."""
    payload = decode(namespace_id, key, value)
    target = out.cast("B") if out.format != "B" or out.ndim != 1 else out
    if payload.nbytes != target.nbytes:
        raise RemoteFormatError(
            f"payload is {payload.nbytes} bytes, the destination holds {target.nbytes}"
        )
    target[:] = payload
    return payload.nbytes
