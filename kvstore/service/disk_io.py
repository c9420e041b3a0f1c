"""The synchronous disk operations the tier service runs in its executors.

Writes (put, delete, touch) run on exactly one thread — LMDB write transactions are
single-threaded — and reads (promotion) on a small pool; LMDB readers never block the writer.
Expected failures (a full or failing disk: `TierError`, `OSError`) are returned as results;
anything else is a bug and propagates, so the owning task dies loudly and is restarted.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from kvstore.keys import BlockKey, short_hex
from kvstore.service.completions import PromotionDone, WriteDone
from tiers.errors import CorruptionError, StoreFullError, TierError

__all__ = ["DiskIO", "DiskStore", "IOReport", "LocalRowWriter", "RowBuffers", "RowWriter"]

logger = logging.getLogger(__name__)


class DiskStore(Protocol):
    """The subset of `tiers` stores the service uses."""

    def put_many(
        self,
        ns: str,
        items: Sequence[tuple[bytes, bytes | memoryview]],
        *,
        now_s: float | None = None,
    ) -> int: ...

    def get_many_into(
        self, ns: str, items: Sequence[tuple[bytes, memoryview]]
    ) -> list[int | CorruptionError | None]: ...

    def delete_many(self, ns: str, keys: Sequence[bytes]) -> int: ...

    def touch_many(self, ns: str, keys: Sequence[bytes], *, now_s: float | None = None) -> None: ...

    def sync(self) -> None: ...

    def close(self) -> None: ...


class RowBuffers(Protocol):
    def row(self, index: int) -> memoryview: ...


class RowWriter(Protocol):
    """The store's write half, addressed by CPU row: in this thread (`LocalRowWriter`) or in
    the disk-writer process (`kvstore.diskwriter.DiskWriterProcess`). Raises as the store does."""

    def put_rows(
        self, namespace: str, items: Sequence[tuple[BlockKey, int]], now_s: float
    ) -> int: ...

    def delete_many(self, namespace: str, keys: Sequence[bytes]) -> int: ...

    def touch_many(self, namespace: str, keys: Sequence[bytes], now_s: float) -> None: ...

    def close(self) -> None: ...


class LocalRowWriter:
    """Writes rows into `store` on the calling thread."""

    def __init__(self, store: DiskStore, rows: RowBuffers) -> None:
        self._store = store
        self._rows = rows

    def put_rows(self, namespace: str, items: Sequence[tuple[BlockKey, int]], now_s: float) -> int:
        pairs = [(key, self._rows.row(row)) for key, row in items]
        return self._store.put_many(namespace, pairs, now_s=now_s)

    def delete_many(self, namespace: str, keys: Sequence[bytes]) -> int:
        return self._store.delete_many(namespace, keys)

    def touch_many(self, namespace: str, keys: Sequence[bytes], now_s: float) -> None:
        self._store.touch_many(namespace, keys, now_s=now_s)

    def close(self) -> None:
        pass  # the store is closed by its owner


@dataclass(frozen=True, slots=True)
class IOReport:
    """What one batch did, for the metrics."""

    direction: str
    num_bytes: int
    duration_s: float
    is_ok: bool
    num_corrupt: int = 0
    num_io_errors: int = 0


class DiskIO:
    """Runs batches against the store; never raises for expected failures (returns them).

    Reads run here, against `store`; writes, deletes and touches go through `writer` (by default
    on the calling thread; `DiskWriterProcess` moves them out of the engine's process).
    """

    def __init__(
        self,
        store: DiskStore,
        namespace: str,
        rows: RowBuffers,
        *,
        writer: RowWriter | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._store = store
        self._ns = namespace
        self._rows = rows
        self._writer = writer if writer is not None else LocalRowWriter(store, rows)
        self._clock = clock

    @property
    def writer(self) -> RowWriter:
        return self._writer

    def write(
        self, items: Sequence[tuple[BlockKey, int]], victims: Sequence[BlockKey]
    ) -> tuple[WriteDone, IOReport]:
        """Delete `victims`, then put every (key, row) in one transaction."""
        start_s = time.perf_counter()
        keys = tuple(key for key, _ in items)
        try:
            if victims:
                self._writer.delete_many(self._ns, list(victims))
            num_bytes = self._writer.put_rows(self._ns, items, self._clock())
        except StoreFullError as exc:
            logger.warning("kvstore disk tier refused %d chunks: %s", len(keys), exc)
            report = self._report("cpu_to_disk", 0, start_s, False)
            return WriteDone(ok=(), failed=keys, duration_s=report.duration_s), report
        except (TierError, OSError) as exc:  # a full or failing disk (tiers maps LMDB's errors)
            logger.error("kvstore disk write of %d chunks failed: %s", len(keys), exc)
            report = self._report("cpu_to_disk", 0, start_s, False, num_io_errors=1)
            return WriteDone(ok=(), failed=keys, duration_s=report.duration_s), report
        report = self._report("cpu_to_disk", num_bytes, start_s, True)
        return WriteDone(ok=keys, num_bytes=num_bytes, duration_s=report.duration_s), report

    def read(self, items: Sequence[tuple[BlockKey, int]]) -> tuple[PromotionDone, IOReport]:
        """Read each key into its CPU row in one read transaction, verifying checksums."""
        start_s = time.perf_counter()
        ok: list[BlockKey] = []
        corrupt: list[BlockKey] = []
        missing: list[BlockKey] = []
        num_bytes = 0
        targets = [(key, self._rows.row(row)) for key, row in items]
        try:
            results = self._store.get_many_into(self._ns, targets)
        except (TierError, OSError) as exc:  # a failing disk: the whole batch is a miss
            logger.error("kvstore disk read of %d chunks failed: %s", len(items), exc)
            done = PromotionDone(ok=(), failed=tuple(key for key, _ in items))
            return done, self._report("disk_to_cpu", 0, start_s, False, num_io_errors=1)
        for (key, row), result in zip(targets, results, strict=True):
            if isinstance(result, CorruptionError):
                logger.warning("kvstore chunk %s is corrupt on disk: %s", short_hex(key), result)
                corrupt.append(key)
            elif result is None:
                missing.append(key)  # deleted under us (`kvstore rm` on a live store): a miss
            elif result != row.nbytes:  # every value written is one row: not one of ours
                logger.warning("kvstore chunk %s has %d bytes, not a row", short_hex(key), result)
                corrupt.append(key)
            else:
                ok.append(key)
                num_bytes += result
        report = self._report(
            "disk_to_cpu", num_bytes, start_s, not (corrupt or missing), len(corrupt)
        )
        done = PromotionDone(
            tuple(ok), (), tuple(corrupt), tuple(missing),
            num_bytes=num_bytes, duration_s=report.duration_s,
        )  # fmt: skip
        return done, report

    def delete(self, keys: Sequence[BlockKey]) -> int:
        try:
            return self._writer.delete_many(self._ns, list(keys))
        except (TierError, OSError) as exc:
            logger.error("kvstore disk delete of %d chunks failed: %s", len(keys), exc)
            return 0

    def touch(self, keys: Sequence[BlockKey]) -> None:
        try:
            self._writer.touch_many(self._ns, list(keys), self._clock())
        except (TierError, OSError) as exc:
            logger.warning("kvstore disk touch of %d chunks failed: %s", len(keys), exc)

    def close(self) -> None:
        """End the writer (the disk-writer process syncs its commits), then sync and close."""
        try:
            self._writer.close()
        finally:
            try:
                self._store.sync()
            finally:
                self._store.close()

    @staticmethod
    def _report(
        direction: str,
        num_bytes: int,
        start_s: float,
        is_ok: bool,
        num_corrupt: int = 0,
        num_io_errors: int = 0,
    ) -> IOReport:
        duration_s = time.perf_counter() - start_s
        return IOReport(direction, num_bytes, duration_s, is_ok, num_corrupt, num_io_errors)
