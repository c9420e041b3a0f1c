"""The block store contract shared by `LMDBStore` and the in-memory `MemoryStore`.

A store keeps values (one chunk row each) under `bytes` keys inside *namespaces* (`str` ids, each
registered with a descriptor of what makes its bytes interchangeable). Every value carries an
xxh64 checksum verified on every read; a mismatch raises `CorruptionError` and never hands the
bytes over as good data. Missing keys are `None`, not errors.
"""

from __future__ import annotations

import ctypes
import struct
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias, cast, runtime_checkable

import msgspec
import xxhash

from tiers.errors import CorruptionError, TierConfigError

if TYPE_CHECKING:
    import numpy as np
    import torch

__all__ = [
    "BlockStore",
    "EntryMeta",
    "NamespaceStats",
    "StoreStats",
    "Value",
    "WritableBuffer",
    "checksum",
    "copy_into",
]

Value = bytes | bytearray | memoryview
WritableBuffer: TypeAlias = "bytearray | memoryview | torch.Tensor | np.ndarray[Any, Any]"

MAX_KEY_BYTES = 400
MAX_NAMESPACE_BYTES = 200
_META = struct.Struct("<QQddI")
META_BYTES = _META.size


def checksum(value: Value) -> int:
    """The xxh64 (seed 0) of `value`, as stored with every entry."""
    return xxhash.xxh64_intdigest(value)


@dataclass(frozen=True, slots=True)
class EntryMeta:
    """What a store records about one entry besides its bytes."""

    namespace: str
    key: bytes
    size_bytes: int
    checksum: int
    created_s: float
    last_access_s: float
    num_hits: int

    def pack(self) -> bytes:
        """The fixed 36-byte record: size u64, xxh64 u64, created f64, last access f64, hits u32."""
        return _META.pack(
            self.size_bytes, self.checksum, self.created_s, self.last_access_s, self.num_hits
        )

    @classmethod
    def unpack(cls, namespace: str, key: bytes, record: bytes | memoryview) -> EntryMeta:
        size_bytes, value_checksum, created_s, last_access_s, num_hits = _META.unpack(record)
        return cls(namespace, key, size_bytes, value_checksum, created_s, last_access_s, num_hits)


@dataclass(frozen=True, slots=True)
class NamespaceStats:
    num_entries: int
    used_bytes: int


@dataclass(frozen=True, slots=True)
class StoreStats:
    """A store's occupancy. `used_bytes` is the sum of value sizes; `file_bytes` is what the
    backing file occupies on disk (allocated blocks), 0 for an in-memory store."""

    num_entries: int
    used_bytes: int
    capacity_bytes: int
    file_bytes: int
    map_size_bytes: int
    namespaces: dict[str, NamespaceStats] = field(default_factory=dict)

    @property
    def free_bytes(self) -> int:
        return max(0, self.capacity_bytes - self.used_bytes)


@runtime_checkable
class BlockStore(Protocol):
    """A checksummed key-value store of chunk rows, grouped by namespace.

    Threading: any thread may read (`get_into`, `contains`, `meta`, scans, `stats`); exactly one
    thread may write (`register_namespace`, `put_many`, `touch_many`, `delete_*`).
    """

    @property
    def capacity_bytes(self) -> int: ...

    def register_namespace(self, namespace: str, descriptor: Mapping[str, Any]) -> None: ...

    def namespaces(self) -> dict[str, dict[str, Any]]: ...

    def put_many(
        self, namespace: str, items: Sequence[tuple[bytes, Value]], *, now_s: float | None = None
    ) -> int: ...

    def get_into(self, namespace: str, key: bytes, out: WritableBuffer) -> int | None: ...

    def get_many_into(
        self, namespace: str, items: Sequence[tuple[bytes, WritableBuffer]]
    ) -> list[int | CorruptionError | None]:
        """`get_into` for many keys in one read transaction; per key the size, None if absent,
        or the CorruptionError (returned, not raised, so one bad chunk spares the others)."""
        ...

    def touch_many(
        self, namespace: str, keys: Sequence[bytes], *, now_s: float | None = None
    ) -> None: ...

    def delete_many(self, namespace: str, keys: Sequence[bytes]) -> int: ...

    def delete_namespace(self, namespace: str) -> int: ...

    def contains(self, namespace: str, key: bytes) -> bool: ...

    def meta(self, namespace: str, key: bytes) -> EntryMeta | None: ...

    def iter_meta(self, namespace: str) -> Iterator[EntryMeta]: ...

    def iter_keys(self, namespace: str) -> Iterator[bytes]: ...

    def find_keys(
        self, namespace: str, hex_prefix: str, *, limit: int | None = None
    ) -> list[bytes]: ...

    def stats(self) -> StoreStats: ...

    def sync(self) -> None: ...

    def close(self) -> None: ...

    def __enter__(self) -> BlockStore: ...

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None: ...


_GIL_FREE_COPY_BYTES = 64 << 10
"""From this size on, `copy_into` copies without the GIL (below it the call costs more)."""


def copy_into(target: memoryview, value: Value) -> None:
    """`target[:len(value)] = value` for flat byte views, without holding the GIL while the
    bytes move when numpy is loaded (an engine's process; the CLI reads stores without it), so
    two readers copy on two cores. `target` must hold `value` (the callers check)."""
    source = memoryview(value)
    size = source.nbytes
    numpy_module = sys.modules.get("numpy")
    if numpy_module is None or size < _GIL_FREE_COPY_BYTES:
        target[:size] = source
        return
    uint8 = numpy_module.uint8
    destination = numpy_module.frombuffer(target, uint8, size)  # raises if target is smaller
    ctypes.memmove(destination.ctypes.data, numpy_module.frombuffer(source, uint8).ctypes.data,
                   size)  # fmt: skip


def check_namespace(namespace: str) -> bytes:
    """The namespace id as UTF-8; raises TierConfigError for an empty or overlong id."""
    if not isinstance(namespace, str) or not namespace:
        raise TierConfigError(f"namespace id must be a non-empty str, got {namespace!r}")
    encoded = namespace.encode()
    if len(encoded) > MAX_NAMESPACE_BYTES:
        raise TierConfigError(
            f"namespace id {namespace[:40]!r}... is {len(encoded)} bytes; at most "
            f"{MAX_NAMESPACE_BYTES} allowed"
        )
    return encoded


def check_key(key: bytes) -> bytes:
    if not isinstance(key, bytes) or not 0 < len(key) <= MAX_KEY_BYTES:
        shown = key[:16].hex() if isinstance(key, bytes) else repr(key)
        raise TierConfigError(
            f"key {shown} must be bytes of 1..{MAX_KEY_BYTES} bytes"
            + (f", got {len(key)}" if isinstance(key, bytes) else "")
        )
    return key


MAX_DESCRIPTOR_DEPTH = 32


def nesting_depth(value: object) -> int:
    """How deeply lists and maps nest in `value` (0 for a scalar), without recursion."""
    depth, level = 0, [value]
    while True:
        containers = [item for item in level if isinstance(item, dict | list | tuple)]
        if not containers:
            return depth
        depth += 1
        level = [
            item
            for container in containers
            for item in (container.values() if isinstance(container, dict) else container)
        ]


def normalize_descriptor(descriptor: Mapping[str, Any]) -> dict[str, Any]:
    """The descriptor as it will read back (msgpack round trip), for comparisons."""
    try:
        decoded = msgspec.msgpack.decode(msgspec.msgpack.encode(dict(descriptor)))
    except (TypeError, msgspec.MsgspecError, RecursionError) as exc:
        raise TierConfigError(
            f"namespace descriptor must hold only msgpack types (str, int, float, bool, None, "
            f"lists, dicts): {exc}"
        ) from exc
    if not isinstance(decoded, dict):
        raise TierConfigError(f"namespace descriptor must be a mapping, got {type(decoded)}")
    if nesting_depth(decoded) > MAX_DESCRIPTOR_DEPTH:
        raise TierConfigError(
            f"namespace descriptor nests {nesting_depth(decoded)} levels deep; at most "
            f"{MAX_DESCRIPTOR_DEPTH} allowed"
        )
    return decoded


def writable_view(out: WritableBuffer) -> memoryview:
    """A writable, flat byte view of the caller's buffer (zero-copy)."""
    # A tensor (an array) exists only once torch (numpy) is imported: the CLI reads stores without.
    torch_module = sys.modules.get("torch")
    if torch_module is not None and isinstance(out, torch_module.Tensor):
        if out.device.type != "cpu" or out.dtype != torch_module.uint8 or not out.is_contiguous():
            raise TierConfigError(
                f"out tensor must be a contiguous CPU uint8 tensor, got {out.dtype} on {out.device}"
            )
        out = out.numpy()
    numpy_module = sys.modules.get("numpy")
    if numpy_module is not None and isinstance(out, numpy_module.ndarray):
        if not out.flags.c_contiguous:
            raise TierConfigError("out array must be C-contiguous")
        out = out.data
    view = memoryview(cast(Any, out))  # a tensor or array became its buffer above
    if view.readonly:
        raise TierConfigError("out buffer is read-only; pass a bytearray, memoryview or tensor")
    return view.cast("B") if view.format != "B" or view.ndim != 1 else view


def prepare_items(items: Sequence[tuple[bytes, Value]]) -> dict[bytes, tuple[memoryview, int]]:
    """Deduplicate (the last value of a key wins), flatten values and checksum them."""
    prepared: dict[bytes, tuple[memoryview, int]] = {}
    for key, value in items:
        view = memoryview(value)
        flat = view.cast("B") if view.format != "B" or view.ndim != 1 else view
        prepared[check_key(key)] = (flat, checksum(flat))
    return prepared


def hex_prefix_bytes(hex_prefix: str) -> bytes:
    """The whole bytes of a hex prefix (an odd final digit is matched separately)."""
    if any(char not in "0123456789abcdefABCDEF" for char in hex_prefix):
        raise TierConfigError(f"key prefix {hex_prefix!r} is not hexadecimal")
    return bytes.fromhex(hex_prefix[: len(hex_prefix) // 2 * 2])
