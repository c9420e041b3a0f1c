"""`RemoteChunks`: one namespace's chunks in a `RemoteStore`, in the remote value format.

The rules of the remote tier live here, once: keys carry the namespace; every value read is
verified (size, xxh64, namespace, key) before a byte reaches the caller's buffer; a value that
fails is a miss, is deleted (unless a newer kvstore wrote it) and is counted; the namespace
descriptor is written once (SET NX) and re-asserted now and then so an LRU-evicting server does
not drop it for good.

A damaged value is deleted with a plain DEL: should another engine rewrite the chunk between
our GET and that DEL, its good copy goes too (a later miss, never bad data).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import AsyncIterator, Callable, Sequence

from kvstore.keys import BlockKey, short_hex
from kvstore.namespace import NamespaceDescriptor, namespace_id
from kvstore.remote import codec
from kvstore.remote.client import RemoteStore
from kvstore.remote.errors import (
    RemoteCorruptError,
    RemoteFormatError,
    RemoteUnavailableError,
    RemoteValueError,
    RemoteVersionError,
)

__all__ = ["RemoteChunks"]

logger = logging.getLogger(__name__)

DESCRIPTOR_REFRESH_S = 60.0


def _reject_kind(exc: RemoteValueError) -> str:
    if isinstance(exc, RemoteVersionError):
        return "version"
    if isinstance(exc, RemoteCorruptError):
        return "corrupt"
    return "format"


class RemoteChunks:
    """Chunks of one namespace: lookup, load into rows, store, remove, scan."""

    def __init__(
        self,
        store: RemoteStore,
        descriptor: NamespaceDescriptor | None = None,
        *,
        namespace: str | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if (descriptor is None) == (namespace is None):
            raise ValueError("give exactly one of descriptor and namespace")
        self.store = store
        self.descriptor = descriptor
        self.namespace_id = namespace_id(descriptor) if descriptor is not None else str(namespace)
        codec.namespace_pattern(self.namespace_id)  # validates the id
        self._clock = clock
        self._descriptor_due = 0.0
        self._descriptor_extra: dict[str, object] = {}

    def add_to_descriptor(self, **extra: object) -> None:
        """Fields stored with the descriptor beside the namespace's own (the engine's chunk
        layout, so `kvstore show` can decode chunks). Takes effect at the next descriptor write,
        which the engine's first write-through does (the layout arrives before any store)."""
        self._descriptor_extra.update(extra)
        self._descriptor_due = 0.0

    def redis_key(self, key: BlockKey) -> bytes:
        return codec.chunk_key(self.namespace_id, key)

    async def lookup(self, keys: Sequence[BlockKey]) -> list[bool]:
        """Which chunks the remote tier holds (one round trip per node); False when down."""
        return await self.store.exists_many([self.redis_key(k) for k in keys])

    async def probe(self, keys: Sequence[BlockKey]) -> tuple[list[bool], bool]:
        """`lookup`, and whether every node answered."""
        return await self.store.exists_answered([self.redis_key(k) for k in keys])

    async def load(self, keys: Sequence[BlockKey]) -> list[memoryview | None]:
        """Each chunk's verified payload (a view of the fetched value), None for a miss."""
        values = await self.store.get_many(
            [self.redis_key(k) for k in keys], value_bytes=self._value_bytes()
        )
        payloads: list[memoryview | None] = []
        rejected: list[BlockKey] = []
        for key, value in zip(keys, values, strict=True):
            payload = None
            if value is not None:
                try:
                    payload = codec.decode(self.namespace_id, key, value)
                except RemoteValueError as exc:
                    self._reject(key, exc, rejected)
            payloads.append(payload)
        await self._delete_rejected(rejected)
        return payloads

    async def load_into(self, keys: Sequence[BlockKey], outs: Sequence[memoryview]) -> list[bool]:
        """Copy each chunk's verified payload into its buffer (which it must fill exactly);
        True where that happened. A miss, an unavailable node or a rejected value is False and
        leaves its buffer untouched."""
        if len(keys) != len(outs):
            raise ValueError(f"{len(keys)} keys but {len(outs)} buffers")
        namespace_id = self.namespace_id

        # Runs on a worker thread; `value` may be a view of a buffer reused for the next value.
        def decode(index: int, value: bytes | memoryview) -> RemoteValueError | bool:
            try:
                codec.decode_into(namespace_id, keys[index], value, outs[index])
            except RemoteValueError as exc:
                return exc
            return True

        results = await self.store.read_many(
            [self.redis_key(k) for k in keys], value_bytes=self._value_bytes(), consume=decode
        )  # per key: None (no value), True (copied) or why the value was rejected
        loaded: list[bool] = []
        rejected: list[BlockKey] = []
        for key, result in zip(keys, results, strict=True):
            if isinstance(result, RemoteValueError):
                self._reject(key, result, rejected)
            loaded.append(result is True)
        await self._delete_rejected(rejected)
        return loaded

    async def measure(self, keys: Sequence[BlockKey]) -> int:
        """Read the chunks' values and drop them, unverified (a measurement of the link, for
        chunks that need no row); returns the bytes read (0 for misses and unavailable nodes)."""
        sizes = await self.store.read_many(
            [self.redis_key(k) for k in keys], value_bytes=self._value_bytes(), consume=_size
        )
        return sum(size for size in sizes if isinstance(size, int))

    def _value_bytes(self) -> int | None:
        if self.descriptor is None:
            return None
        return codec.HEADER.size + self.descriptor.row_bytes

    def _reject(self, key: BlockKey, exc: RemoteValueError, rejected: list[BlockKey]) -> None:
        kind = _reject_kind(exc)
        self.store.report_rejected(kind)
        logger.warning("remote chunk %s rejected (%s): %s", short_hex(key), kind, exc)
        if not isinstance(exc, RemoteVersionError):  # a newer kvstore may still read it
            rejected.append(key)

    async def _delete_rejected(self, keys: list[BlockKey]) -> None:
        if keys:
            await self.store.delete_many([self.redis_key(k) for k in keys])

    async def store_many(
        self, items: Sequence[tuple[BlockKey, bytes | bytearray | memoryview]]
    ) -> list[bool]:
        """Encode and SET each chunk; True where the write landed (the caller's cue for
        `BlockStored`). Re-asserts the namespace descriptor when due."""
        if not items or not self.store.config.enable_write:
            return [False] * len(items)
        await self._assert_descriptor()
        encoded = [
            (self.redis_key(key), codec.encode(self.namespace_id, key, payload))
            for key, payload in items
        ]
        return await self.store.put_many(encoded)

    async def touch(self, keys: Sequence[BlockKey]) -> list[bool]:
        """TOUCH chunks (an access for Redis's LRU/LFU, no value read); True where one exists;
        False for all when down."""
        return await self.store.touch_many([self.redis_key(k) for k in keys])

    async def remove(self, keys: Sequence[BlockKey]) -> list[bool]:
        """DEL chunks; True where one was deleted."""
        return await self.store.delete_many([self.redis_key(k) for k in keys])

    async def scan(self) -> AsyncIterator[BlockKey]:
        """Every chunk key of this namespace (SCAN on every master; raises
        RemoteUnavailableError when a master is down)."""
        async for redis_key in self.store.scan_keys(codec.namespace_pattern(self.namespace_id)):
            key = codec.parse_chunk_key(self.namespace_id, redis_key)
            if key is not None:
                yield key

    async def read_descriptor(self) -> NamespaceDescriptor | None:
        """The stored descriptor of this namespace, None if absent."""
        raw = await self.store.get_descriptor(self.namespace_id)
        if raw is None:
            return None
        try:
            document = json.loads(raw)
        except ValueError as exc:
            raise RemoteFormatError(
                f"descriptor of namespace {self.namespace_id} is not JSON: {exc}"
            ) from exc
        if not isinstance(document, dict):
            raise RemoteFormatError(
                f"descriptor of namespace {self.namespace_id} is not a JSON object"
            )
        return NamespaceDescriptor.from_dict(document)

    async def _assert_descriptor(self) -> None:
        if self.descriptor is None or self._clock() < self._descriptor_due:
            return
        document = json.dumps(
            {**self.descriptor.to_dict(), **self._descriptor_extra}, sort_keys=True
        ).encode()
        try:
            await self.store.put_descriptor(self.namespace_id, document)
        except RemoteUnavailableError as exc:  # try again with the next batch
            logger.debug("remote descriptor not written: %s", exc)
            return
        self._descriptor_due = self._clock() + DESCRIPTOR_REFRESH_S


def _size(index: int, value: bytes | memoryview) -> int:
    return len(value)
