"""The pipeline's disk rules, once: `DiskSteps`, driven by both configurations of the pipeline.

`TierPipeline` writes chunks through from its CPU rows and promotes them back; `DiskPipeline`
(the disk-only configuration `LMDBTier` drives) writes rows vLLM owns and reads into rows vLLM
gives. Both ask the same steps to move the bytes, so these rules cannot drift between them:

- A write or read is queued with the tier service; one the service refuses (queue full, disk
  down, shutting down) is rolled back at once: the chunks it reserved leave the disk index
  unwritten, the pins a read took are dropped.
- A finished write makes its chunks ready on disk (or drops the failed ones).
- A finished read lands its chunks; the others did not: `failed` (an I/O error: the chunk stays
  on disk, maybe it was transient), `corrupt` (its checksum or size is wrong: taken out of
  service as "corrupt"; the service deletes it) and `missing` (deleted behind the index's back,
  e.g. by `kvstore rm`: taken out of service as "deleted", the metrics' label for it).
- A chunk's disk record (last access, hit count) is touched when a load of it has been served,
  not when it is prepared: a load that fails does not count as a hit.

Threading: the owner of the index calls everything (see `TierPipeline`, `DiskPipeline`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from kvstore.index import TierIndex
from kvstore.index.disk import DiskIndex
from kvstore.keys import BlockKey, Tier
from kvstore.service.completions import PromotionDone, WriteDone

__all__ = [
    "CORRUPT_REASON",
    "DiskPlacement",
    "DiskSteps",
    "DiskSubmitter",
    "IndexedDisk",
    "RowsOnDisk",
    "VANISHED_REASON",
]

CORRUPT_REASON = "corrupt"
VANISHED_REASON = "deleted"
"""The removal reason of a chunk a read found gone from the store (one of the metrics' labels)."""


class DiskSubmitter(Protocol):
    """The tier service's disk intake (`TierService`, `InlineTierService`)."""

    def submit_write(
        self, items: Sequence[tuple[BlockKey, int]], victims: Sequence[BlockKey]
    ) -> bool: ...

    def submit_promotion(
        self, items: Sequence[tuple[BlockKey, int]], tag: object = None
    ) -> bool: ...

    def submit_delete(self, keys: Sequence[BlockKey]) -> None: ...

    def submit_touch(self, keys: Sequence[BlockKey]) -> None: ...


class DiskPlacement(Protocol):
    """The disk side of an index, as the steps end its work."""

    def end_write(self, keys: Sequence[BlockKey], ok: bool) -> None:
        """End the writes of chunks reserved on disk: ready, or dropped."""

    def end_read(self, keys: Sequence[BlockKey], ok: bool) -> None:
        """End the reads of pinned disk chunks (landed, or not)."""

    def discard(self, keys: Sequence[BlockKey], reason: str) -> None:
        """Take chunks out of service on disk (reported removed with `reason`)."""


class RowsOnDisk:
    """`TierIndex`'s disk side: writes through from CPU rows, reads promote into them."""

    def __init__(self, index: TierIndex) -> None:
        self._index = index

    def end_write(self, keys: Sequence[BlockKey], ok: bool) -> None:
        self._index.complete_write_through(keys, ok)

    def end_read(self, keys: Sequence[BlockKey], ok: bool) -> None:
        self._index.complete_promotion(keys, ok)

    def discard(self, keys: Sequence[BlockKey], reason: str) -> None:
        self._index.discard(keys, Tier.DISK, reason)


class IndexedDisk:
    """`DiskIndex` on its own: the rows belong to someone else (vLLM's CPU tier)."""

    def __init__(self, index: DiskIndex) -> None:
        self._index = index

    def end_write(self, keys: Sequence[BlockKey], ok: bool) -> None:
        self._index.complete(keys, ok)

    def end_read(self, keys: Sequence[BlockKey], ok: bool) -> None:
        self._index.finish_read(keys)  # drops the read's pins either way

    def discard(self, keys: Sequence[BlockKey], reason: str) -> None:
        self._index.discard(keys, reason)


class DiskSteps:
    """See the module docstring."""

    def __init__(self, service: DiskSubmitter, placement: DiskPlacement) -> None:
        self._service = service
        self._placement = placement

    def write(self, items: Sequence[tuple[BlockKey, int]], evicted: Sequence[BlockKey]) -> bool:
        """Queue the writes of chunks reserved on disk (`items`: key, row) and the deletes of
        the chunks evicted to make room. False: refused, and the reservations rolled back."""
        if not items:
            if evicted:
                self._service.submit_delete(evicted)
            return True
        if self._service.submit_write(items, evicted):
            return True
        self._placement.end_write([key for key, _ in items], False)
        return False

    def read(self, items: Sequence[tuple[BlockKey, int]], tag: object = None) -> bool:
        """Queue the reads of pinned disk chunks into rows (one result, carrying `tag`).
        False: refused, and the reads ended as failed."""
        if not items or self._service.submit_promotion(items, tag):
            return True
        self._placement.end_read([key for key, _ in items], False)
        return False

    def finish_write(self, done: WriteDone) -> None:
        self._placement.end_write(done.ok, True)
        self._placement.end_write(done.failed, False)

    def finish_read(self, done: PromotionDone) -> tuple[BlockKey, ...]:
        """End a read; returns the chunks that did not land (failed, corrupt, missing)."""
        placement = self._placement
        placement.end_read(done.ok, True)
        lost = done.failed + done.corrupt + done.missing
        placement.end_read(lost, False)
        if done.corrupt:
            placement.discard(done.corrupt, CORRUPT_REASON)
        if done.missing:
            placement.discard(done.missing, VANISHED_REASON)
        return lost

    def served(self, keys: Sequence[BlockKey]) -> None:
        """A load of these chunks was served: their disk records are touched (batched)."""
        if keys:
            self._service.submit_touch(list(keys))
