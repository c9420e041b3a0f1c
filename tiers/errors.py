"""Errors raised by the storage media.

    TierError                 root of every error raised by `tiers`
    ├── TierConfigError       bad path, size, layout or option (also a ValueError)
    ├── RegionError           the shared CPU region: live owner, size mismatch, bad header
    ├── CorruptionError       a stored value fails its checksum or has the wrong size
    ├── StoreFullError        a put would exceed the store's capacity (nothing was written)
    ├── StoreIOError          an LMDB read, write or commit failed: a full or failing disk, or a
    │   │                     store file truncated, replaced or damaged under the open store
    │   └── StoreNoSpaceError the filesystem has no room for the pages a `writemap` write needs
    ├── StoreDamagedError     a store record (format, capacity, namespace, counts) cannot be decoded
    └── NamespaceError        unknown namespace, descriptor mismatch, incompatible store format

Expected outcomes are not errors: a missing key is `None`, not an exception.
"""

from __future__ import annotations

__all__ = [
    "CorruptionError",
    "NamespaceError",
    "RegionError",
    "StoreDamagedError",
    "StoreFullError",
    "StoreIOError",
    "StoreNoSpaceError",
    "TierConfigError",
    "TierError",
]


class TierError(Exception):
    """Root of the errors raised by `tiers`."""


class TierConfigError(TierError, ValueError):
    """A path, size, layout or option is invalid; the message names it and what is allowed."""


class RegionError(TierError):
    """The shared CPU region cannot be created, attached or accessed as asked."""


class CorruptionError(TierError):
    """A stored value does not match its checksum or recorded size; its bytes were not used."""

    def __init__(self, message: str, *, namespace: str, key: bytes) -> None:
        super().__init__(message)
        self.namespace = namespace
        self.key = key


class StoreFullError(TierError):
    """A put needs more bytes than the store has free; nothing was written."""

    def __init__(self, message: str, *, requested_bytes: int, free_bytes: int) -> None:
        super().__init__(message)
        self.requested_bytes = requested_bytes
        self.free_bytes = free_bytes


class StoreIOError(TierError):
    """Reading or writing the store file failed: a full or failing disk, or a file truncated,
    replaced or damaged under the open store. A failed write wrote nothing (its transaction was
    aborted); after a truncated or replaced file, every operation of the store fails this way."""


class StoreNoSpaceError(StoreIOError):
    """A `writemap` writer could not allocate disk blocks for the pages a write may need (the
    filesystem is full); nothing was written. A writer without `writemap` can still write into
    the free pages inside the file (see `tiers._lmdb_reserve`)."""


class StoreDamagedError(TierError):
    """A record the store keeps about itself (format, capacity, a namespace registration, the
    per-namespace counts) cannot be decoded: the store file is damaged."""


class NamespaceError(TierError):
    """Unknown namespace, a descriptor that differs from the stored one, or a store whose
    format version this code cannot read."""
