"""Reading an LMDB store's chunk with its checksum verified, tolerating a live writer."""

from __future__ import annotations

from kvstore.cli._chunks import ChecksumState, ChunkMeta, ChunkRead
from tiers.errors import CorruptionError, TierConfigError
from tiers.lmdb import LMDBStore
from tiers.store import EntryMeta

__all__ = ["ChunkReader"]

_MAX_ATTEMPTS = 3


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
                return ChunkRead(namespace, key, ChecksumState.CORRUPT, None, error=str(exc))
            if meta is None:
                return ChunkRead(namespace, key, ChecksumState.VANISHED, None)
            if meta == previous:  # same record, yet the value does not fit its recorded size
                break
            outcome = self._read_value(meta)
            if outcome is not None:
                return outcome
            previous = meta
        error = f"value of key {key.hex()[:16]} in namespace {namespace!r} is larger than its "
        last = None if previous is None else ChunkMeta.from_entry(previous)
        return ChunkRead(namespace, key, ChecksumState.CORRUPT, last, error=error + "recorded size")

    def _read_value(self, meta: EntryMeta) -> ChunkRead | None:
        """The outcome, or None if the value does not fit the size its meta records."""
        chunk = ChunkMeta.from_entry(meta)

        def outcome(
            state: ChecksumState, value: memoryview | None = None, error: str = ""
        ) -> ChunkRead:
            return ChunkRead(meta.namespace, meta.key, state, chunk, value, error)

        if len(self._buffer) < meta.size_bytes:
            file_bytes = (self._store.path / "data.mdb").stat().st_size
            if meta.size_bytes > file_bytes:  # a damaged meta record: never allocate that
                return outcome(
                    ChecksumState.CORRUPT,
                    error=f"meta record of key {meta.key.hex()[:16]} in namespace "
                    f"{meta.namespace!r} says {meta.size_bytes} bytes, more than the whole store "
                    f"file ({file_bytes})",
                )
            self._buffer = bytearray(meta.size_bytes)
        view = memoryview(self._buffer)[: meta.size_bytes]
        try:
            size = self._store.get_into(meta.namespace, meta.key, view)
        except CorruptionError as exc:
            return outcome(ChecksumState.CORRUPT, error=str(exc))
        except TierConfigError:  # larger than recorded: rewritten meanwhile, or damaged
            return None
        if size is None:
            return outcome(ChecksumState.VANISHED)
        return outcome(ChecksumState.OK, view[:size])
