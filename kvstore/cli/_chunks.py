"""What the store commands know about a chunk, whichever backend holds it.

`ChunkMeta` holds what a backend records; a field a backend does not keep is None (Redis counts
no hits and keeps no creation time; it knows a value's size and checksum once the value's header
is read). `ChunkRead` is the outcome of reading one chunk with its checksum verified.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from tiers.store import EntryMeta

__all__ = ["ChecksumState", "ChunkMeta", "ChunkRead"]


class ChecksumState(StrEnum):
    """What is known about a chunk's checksum."""

    UNVERIFIED = "unverified"
    OK = "ok"
    CORRUPT = "corrupt"
    VANISHED = "vanished"  # deleted (by a live engine or another tool) while being read
    NEWER_FORMAT = "newer_format"  # written by a newer kvstore: not checked, never deleted


@dataclass(frozen=True, slots=True)
class ChunkMeta:
    """One chunk's metadata; None where the backend does not record it."""

    namespace: str
    key: bytes
    size_bytes: int | None = None  # the payload
    memory_bytes: int | None = None  # Redis: what the value costs the server (MEMORY USAGE)
    num_hits: int | None = None
    created_s: float | None = None
    last_access_s: float | None = None
    checksum: int | None = None  # xxh64 of the payload, as recorded

    @classmethod
    def from_entry(cls, meta: EntryMeta) -> ChunkMeta:
        """An LMDB store's record (it keeps everything but memory_bytes)."""
        return cls(
            namespace=meta.namespace,
            key=meta.key,
            size_bytes=meta.size_bytes,
            num_hits=meta.num_hits,
            created_s=meta.created_s,
            last_access_s=meta.last_access_s,
            checksum=meta.checksum,
        )

    @property
    def used_bytes(self) -> int:
        """What the chunk takes where it is stored: the server's memory for Redis, the payload
        for LMDB (0 when neither is known)."""
        if self.memory_bytes is not None:
            return self.memory_bytes
        return self.size_bytes or 0


@dataclass(frozen=True, slots=True)
class ChunkRead:
    """The outcome of reading one chunk: its state, its meta (None if it vanished or its record
    cannot be read) and its verified payload (valid until the next read of the same reader)."""

    namespace: str
    key: bytes
    state: ChecksumState
    meta: ChunkMeta | None
    value: memoryview | None = None
    error: str = ""
