"""Reading a chunk's bytes with its checksum verified, tolerating a live writer."""

from __future__ import annotations

from dataclasses import dataclass

from kvstore.cli._describe import ChecksumState
from tiers.errors import CorruptionError, TierConfigError
from tiers.lmdb import LMDBStore
from tiers.store import EntryMeta

__all__ = ["ChunkRead", "ChunkReader"]

_MAX_ATTEMPTS = 3


@dataclass(frozen=True, slots=True)
class ChunkRead:
    """The outcome of reading one chunk: its state, its meta (None if vanished) and bytes."""

    state: ChecksumState
    meta: EntryMeta | None
    value: memoryview | None = None
    error: str = ""


class ChunkReader:
    """Reads chunks into one reusable buffer (valid until the next read), verifying checksums.

    A chunk deleted meanwhile (a live engine evicting it) is `VANISHED`, not an error; a chunk
    rewritten between reading its meta and its value is read again.
    """

    def __init__(self, store: LMDBStore) -> None:
        self._store = store
        self._buffer = bytearray(0)

    def read(self, namespace: str, key: bytes) -> ChunkRead:
        previous: EntryMeta | None = None
        for _ in range(_MAX_ATTEMPTS):
            try:
                meta = self._store.meta(namespace, key)
            except CorruptionError as exc:
                return ChunkRead(ChecksumState.CORRUPT, None, error=str(exc))
            if meta is None:
                return ChunkRead(ChecksumState.VANISHED, None)
            if meta == previous:  # same record, yet the value does not fit its recorded size
                break
            outcome = self._read_value(meta)
            if outcome is not None:
                return outcome
            previous = meta
        error = f"value of key {key.hex()[:16]} in namespace {namespace!r} is larger than its "
        return ChunkRead(ChecksumState.CORRUPT, previous, error=error + "recorded size")

    def _read_value(self, meta: EntryMeta) -> ChunkRead | None:
        """The outcome, or None if the value does not fit the size its meta records."""
        if len(self._buffer) < meta.size_bytes:
            file_bytes = (self._store.path / "data.mdb").stat().st_size
            if meta.size_bytes > file_bytes:  # a damaged meta record: never allocate that
                error = (
                    f"meta record of key {meta.key.hex()[:16]} in namespace {meta.namespace!r} "
                    f"says {meta.size_bytes} bytes, more than the whole store file ({file_bytes})"
                )
                return ChunkRead(ChecksumState.CORRUPT, meta, error=error)
            self._buffer = bytearray(meta.size_bytes)
        view = memoryview(self._buffer)[: meta.size_bytes]
        try:
            size = self._store.get_into(meta.namespace, meta.key, view)
        except CorruptionError as exc:
            return ChunkRead(ChecksumState.CORRUPT, meta, error=str(exc))
        except TierConfigError:  # larger than recorded: rewritten meanwhile, or damaged
            return None
        if size is None:
            return ChunkRead(ChecksumState.VANISHED, meta)
        return ChunkRead(ChecksumState.OK, meta, view[:size])
