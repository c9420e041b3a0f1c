"""`RedisSource`: the remote tier (a Redis server or Redis Cluster) as a `ChunkSource`.

What each step costs, and what it touches:

- Namespaces: one SCAN of `kvstore:*` on every master (never KEYS), keys grouped by namespace;
  chunk keys count too, so a namespace whose descriptor Redis evicted still shows. The listing
  is kept for the command's life (a chunk written meanwhile is not listed; one deleted meanwhile
  is skipped, or `vanished` when read).
- Metadata (`stat`, `ls`): `MEMORY USAGE` and `OBJECT IDLETIME` per chunk, pipelined per node.
  Both are O(1) for a string and return a few bytes, as STRLEN or `GETRANGE 0 39` would; unlike
  those two (and GET), neither counts as an access, so inspecting a shared tier does not reorder
  the LRU/LFU eviction of the engines using it. MEMORY USAGE is also what a value costs against
  `maxmemory`. Under an LFU policy Redis keeps no idle time: last access is unknown (None).
- Payload size and checksum are in each value's header: known once the value is read
  (`ls --verify`, `show`, `verify`): GET in pipelines of at most `pipeline_bytes`, verified with
  the remote value format (`kvstore.remote.codec`). A GET does count as an access (Redis 7.0 has
  no way to read without one).
- Deletes (`rm`, `verify --repair`): DEL, pipelined per node.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from dataclasses import replace
from itertools import islice
from typing import Any

from redis.exceptions import RedisError

from kvstore.cli._chunks import ChecksumState, ChunkMeta, ChunkRead
from kvstore.cli._common import UsageError
from kvstore.cli._redis_io import Command, RedisAdmin
from kvstore.cli._source import ChunkSource
from kvstore.remote import (
    RemoteConfig,
    RemoteConfigError,
    RemoteError,
    RemoteValueError,
    RemoteVersionError,
    codec,
)
from kvstore.remote._backends import split_by_bytes

__all__ = ["RedisSource", "open_redis_source"]

_PAGE_KEYS = 256
_META: tuple[Command, ...] = (("MEMORY", "USAGE"), ("OBJECT", "IDLETIME"))
_OPTION_NAMES = {
    "remote_url": "STORE",
    "remote_password_env": "--password-env",
    "remote_timeout_ms": "--timeout-ms",
}


def _pages(keys: Iterable[bytes]) -> Iterator[list[bytes]]:
    iterator = iter(keys)
    while page := list(islice(iterator, _PAGE_KEYS)):
        yield page


def _descriptor(raw: object) -> dict[str, Any]:
    """A stored descriptor as a dict ({} when absent or not a JSON object)."""
    if not isinstance(raw, bytes):
        return {}
    try:
        document = json.loads(raw)
    except (ValueError, RecursionError):
        return {}
    return document if isinstance(document, dict) else {}


def _meta(namespace: str, key: bytes, replies: Sequence[Any], now_s: float) -> ChunkMeta | None:
    """From `MEMORY USAGE` and `OBJECT IDLETIME` replies; None when the key is gone."""
    memory, idle = replies
    if not isinstance(memory, int):
        return None
    last_access_s = now_s - idle if isinstance(idle, int) else None
    return ChunkMeta(namespace, key, memory_bytes=memory, last_access_s=last_access_s)


def _verify(namespace: str, key: bytes, value: object, meta: ChunkMeta | None) -> ChunkRead:
    """One fetched value checked against the remote value format."""
    if value is None or meta is None:
        return ChunkRead(namespace, key, ChecksumState.VANISHED, meta)
    if not isinstance(value, bytes):  # e.g. WRONGTYPE: someone else's key under our prefix
        error = f"not a kvstore value: {value}"
        return ChunkRead(namespace, key, ChecksumState.CORRUPT, meta, error=error)
    try:
        header = codec.read_header(value)
        meta = replace(meta, size_bytes=header.payload_bytes, checksum=header.payload_xxh64)
        payload = codec.decode(namespace, key, value)
    except RemoteVersionError as exc:
        return ChunkRead(namespace, key, ChecksumState.NEWER_FORMAT, meta, error=str(exc))
    except RemoteValueError as exc:
        return ChunkRead(namespace, key, ChecksumState.CORRUPT, meta, error=str(exc))
    return ChunkRead(namespace, key, ChecksumState.OK, meta, payload)


def _total(replies: Sequence[Mapping[str, Any]], field: str) -> int | None:
    values = [reply.get(field) for reply in replies]
    if not values or not all(isinstance(value, int) for value in values):
        return None
    return sum(int(value) for value in values if isinstance(value, int))


class RedisSource:
    """The chunks of every namespace on one server or cluster (see the module docstring)."""

    no_layout_reason = (
        "the remote tier's namespace descriptor has no chunk_layout (the engine stores it "
        "without one), so chunks cannot be decoded"
    )

    def __init__(
        self,
        admin: RedisAdmin,
        runner: asyncio.Runner,
        *,
        pipeline_bytes: int,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._admin = admin
        self._runner = runner
        self._pipeline_bytes = pipeline_bytes
        self._clock = clock
        self._keys: dict[str, dict[bytes, None]] | None = None
        self._with_descriptor: set[str] = set()
        self._descriptors: dict[str, Mapping[str, Any]] | None = None

    @property
    def location(self) -> str:
        return self._admin.display

    def where(self) -> dict[str, str]:
        return {"url": self._admin.display}

    def _per_key(self, keys: Sequence[bytes], *commands: Command) -> list[list[Any]]:
        return self._runner.run(self._admin.per_key(keys, *commands))

    def _listing(self) -> dict[str, dict[bytes, None]]:
        if self._keys is None:
            keys: dict[str, dict[bytes, None]] = {}
            self._with_descriptor = set()
            for redis_key in self._runner.run(self._admin.scan(codec.namespace_pattern())):
                parts = codec.split_key(redis_key)
                if parts is None:
                    continue
                namespace, key = parts
                chunks = keys.setdefault(namespace, {})
                if key is None:
                    self._with_descriptor.add(namespace)
                else:
                    chunks[bytes(key)] = None
            self._keys = keys
        return self._keys

    def summary(self) -> dict[str, Any]:
        """The masters' memory, limit, eviction policy and evictions (INFO memory, stats)."""
        memory = self._runner.run(self._admin.info("memory"))
        stats = self._runner.run(self._admin.info("stats"))
        used = _total(memory, "used_memory")
        limit = _total(memory, "maxmemory")
        has_limit = bool(limit) and all(reply.get("maxmemory") for reply in memory)
        policies = sorted({str(r["maxmemory_policy"]) for r in memory if "maxmemory_policy" in r})
        backend = self._admin.backend
        return {
            "backend": "redis",
            "is_cluster": backend.is_cluster,
            "masters": [master.name for master in backend.masters()],
            "server_used_memory_bytes": used,
            "maxmemory_bytes": limit if has_limit else None,
            "server_fill_ratio": round(used / limit, 6) if used is not None and limit else None,
            "maxmemory_policy": ",".join(policies) or None,
            "num_evicted_keys": _total(stats, "evicted_keys"),
        }

    def namespaces(self) -> dict[str, Mapping[str, Any]]:
        if self._descriptors is None:
            names = sorted(self._listing())
            described = [name for name in names if name in self._with_descriptor]
            replies = self._per_key([codec.descriptor_key(name) for name in described], ("GET",))
            descriptors: dict[str, Mapping[str, Any]] = {name: {} for name in names}
            for name, (raw,) in zip(described, replies, strict=True):
                descriptors[name] = _descriptor(raw)
            self._descriptors = descriptors
        return self._descriptors

    def num_chunks(self, namespaces: Sequence[str]) -> int:
        listing = self._listing()
        return sum(len(listing.get(namespace, {})) for namespace in namespaces)

    def iter_keys(self, namespace: str) -> Iterator[bytes]:
        return iter(sorted(self._listing().get(namespace, {})))

    def iter_meta(self, namespace: str) -> Iterator[ChunkMeta]:
        for page in _pages(self.iter_keys(namespace)):
            now_s = self._clock()
            redis_keys = [codec.chunk_key(namespace, key) for key in page]
            for key, replies in zip(page, self._per_key(redis_keys, *_META), strict=True):
                meta = _meta(namespace, key, replies, now_s)
                if meta is not None:
                    yield meta

    def find_keys(self, namespace: str, prefix: str, limit: int) -> list[bytes]:
        prefix = prefix.lower()
        found = (key for key in self.iter_keys(namespace) if key.hex().startswith(prefix))
        return list(islice(found, limit))

    def meta(self, namespace: str, key: bytes) -> ChunkMeta | None:
        (replies,) = self._per_key([codec.chunk_key(namespace, key)], *_META)
        return _meta(namespace, key, replies, self._clock())

    def read_many(self, namespace: str, keys: Iterable[bytes]) -> Iterator[ChunkRead]:
        for page in _pages(keys):
            now_s = self._clock()
            redis_keys = [codec.chunk_key(namespace, key) for key in page]
            metas = [
                _meta(namespace, key, replies, now_s)
                for key, replies in zip(page, self._per_key(redis_keys, *_META), strict=True)
            ]
            sizes = [0 if meta is None else meta.used_bytes for meta in metas]
            for part in split_by_bytes(list(range(len(page))), sizes, self._pipeline_bytes):
                values = self._per_key([redis_keys[i] for i in part], ("GET",))
                for i, (value,) in zip(part, values, strict=True):
                    yield _verify(namespace, page[i], value, metas[i])

    def delete_many(self, namespace: str, keys: Sequence[bytes]) -> int:
        num_deleted = 0
        for page in _pages(keys):
            replies = self._per_key([codec.chunk_key(namespace, key) for key in page], ("DEL",))
            num_deleted += sum(reply for (reply,) in replies if isinstance(reply, int))
        listed = self._listing().get(namespace, {})
        for key in keys:
            listed.pop(key, None)
        return num_deleted

    def delete_namespace(self, namespace: str) -> int:
        """DEL the descriptor (a live engine writes it again within a minute)."""
        self._per_key([codec.descriptor_key(namespace)], ("DEL",))
        self._listing().pop(namespace, None)
        self._descriptors = None
        return 0

    def totals(self) -> tuple[int, int]:
        """Listed again: (chunks, their MEMORY USAGE)."""
        self._keys, self._descriptors = None, None
        namespaces = list(self._listing())
        used = sum(meta.used_bytes for ns in namespaces for meta in self.iter_meta(ns))
        return self.num_chunks(namespaces), used

    @contextmanager
    def for_writing(self) -> Iterator[ChunkSource]:
        yield self


def _in_cli_words(message: str) -> str:
    """A remote tier config message, naming the command line's options instead of the keys."""
    for key, option in _OPTION_NAMES.items():
        message = message.replace(key, option)
    return message


def _config(url: str, password_env: str | None, timeout_ms: int) -> RemoteConfig:
    values = {
        "remote_url": url,
        "remote_password_env": password_env,
        "remote_timeout_ms": timeout_ms,
    }
    try:
        config = RemoteConfig.from_values(values)
    except RemoteConfigError as exc:
        raise UsageError(_in_cli_words(str(exc))) from None
    if config is None:  # pragma: no cover - remote_url is given
        raise UsageError(f"{url!r} is not a Redis URL")
    return config


@contextmanager
def open_redis_source(url: str, password_env: str | None, timeout_ms: int) -> Iterator[RedisSource]:
    """Connected to the server or cluster `url` names (within `timeout_ms`), closed on exit."""
    config = _config(url, password_env, timeout_ms)
    admin = RedisAdmin(config)
    with asyncio.Runner() as runner:
        try:
            try:
                runner.run(admin.open())
            except RemoteConfigError as exc:  # e.g. a seed list naming a standalone server
                raise UsageError(_in_cli_words(str(exc))) from None
            yield RedisSource(admin, runner, pipeline_bytes=config.pipeline_bytes)
        finally:
            # Closing what may never have opened: the command's outcome stands.
            with suppress(RemoteError, RedisError, TimeoutError, OSError):
                runner.run(admin.close())
