"""`LMDBTier`'s I/O: opening and scanning the store at start (`open_tier_store`,
`seeded_chunks`), then the copies between vLLM's primary CPU slots and the store (`TierIO`).

Writes (delete victims + put, deletes, hit touches) run on exactly ONE thread, as LMDB requires,
through kvstore's `DiskIO`; reads run on a small pool. Every job posts one outcome to a queue
that the scheduler thread drains; nothing here raises into vLLM.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, replace

from kvstore.errors import ConfigError
from kvstore.keys import BlockKey, short_hex
from kvstore.namespace import NamespaceDescriptor, namespace_id
from kvstore.service.disk_io import DiskIO
from kvstore.vllm.lmdb_tier_options import LMDBTierOptions
from kvstore.vllm.lmdb_tier_state import DiskChunks
from tiers.errors import CorruptionError, TierConfigError, TierError
from tiers.lmdb import LMDBStore

__all__ = [
    "LoadOutcome",
    "Outcome",
    "PrimarySlots",
    "StoreOutcome",
    "TierIO",
    "open_tier_store",
    "seeded_chunks",
]

logger = logging.getLogger(__name__)


def open_tier_store(
    options: LMDBTierOptions, descriptor: NamespaceDescriptor, slot_bytes: int
) -> LMDBStore:
    """Open (or create) the store and register the tier's namespace in it (at engine start,
    before any writer thread exists)."""
    if options.capacity_bytes < slot_bytes:
        raise ConfigError(
            f"LMDBTier option 'capacity_bytes': {options.capacity_bytes} bytes is smaller than "
            f"one chunk ({slot_bytes} bytes)"
        )
    try:
        store = LMDBStore.open(options.path, capacity_bytes=options.capacity_bytes)
    except (TierError, OSError) as exc:
        raise ConfigError(
            f"LMDBTier option 'path': cannot open an LMDB store at {options.path}: {exc}"
        ) from exc
    namespace = namespace_id(descriptor)
    try:
        if namespace not in store.namespaces():
            store.register_namespace(namespace, descriptor.to_dict())
    except BaseException:
        store.close()
        raise
    return store


def seeded_chunks(
    store: LMDBStore, options: LMDBTierOptions, descriptor: NamespaceDescriptor
) -> DiskChunks:
    """The index over what the store already holds in the namespace (a restart's hits), within
    the capacity the store's other namespaces leave; deletes what does not fit."""
    namespace, slot_bytes = namespace_id(descriptor), descriptor.row_bytes
    stats = store.stats()
    others = stats.used_bytes - stats.namespaces[namespace].used_bytes
    budget = options.capacity_bytes - others
    if budget < slot_bytes:
        raise ConfigError(
            f"LMDBTier option 'capacity_bytes': other namespaces of {store.path} use {others} "
            f"of its {options.capacity_bytes} bytes, leaving less than one chunk ({slot_bytes} "
            f"bytes); raise capacity_bytes or remove them with `kvstore rm --namespace`"
        )
    if others:
        logger.warning(
            "LMDBTier: other namespaces of %s use %d bytes; this engine may use %d",
            store.path, others, budget,
        )  # fmt: skip
    chunks = DiskChunks(
        options.eviction_policy, budget, slot_bytes, descriptor.num_tokens_per_chunk
    )
    doomed = chunks.seed(store.iter_meta(namespace))
    if doomed:
        store.delete_many(namespace, doomed)
        logger.info("LMDBTier: deleted %d chunks beyond capacity or of a wrong size", len(doomed))
    return chunks


class PrimarySlots:
    """vLLM's primary CPU tier as rows: slot `c` is `strides[0]` bytes at `c * strides[0]`."""

    def __init__(self, view: memoryview) -> None:
        if view.ndim < 1 or view.strides is None or not view.c_contiguous:
            raise ConfigError(
                f"LMDBTier: the primary KV view must be a C-contiguous [num_slots, slot_bytes] "
                f"buffer, got ndim={view.ndim}, strides={view.strides}"
            )
        self.slot_bytes = int(view.strides[0])
        self.num_slots = int(view.shape[0]) if view.shape else 0
        if self.slot_bytes <= 0 or view.nbytes != self.num_slots * self.slot_bytes:
            raise ConfigError(
                f"LMDBTier: the primary KV view has {view.nbytes} bytes, not "
                f"{self.num_slots} slots x {self.slot_bytes} bytes"
            )
        self._flat = view.cast("B")

    def row(self, index: int) -> memoryview:
        start = index * self.slot_bytes
        return self._flat[start : start + self.slot_bytes]

    def release(self) -> None:
        self._flat.release()


@dataclass(frozen=True, slots=True)
class StoreOutcome:
    """A store job's write finished: `ok` keys are on disk, `failed` are not."""

    job_id: int
    ok: tuple[BlockKey, ...]
    failed: tuple[BlockKey, ...]
    num_bytes: int
    duration_s: float
    num_io_errors: int = 0


@dataclass(frozen=True, slots=True)
class LoadOutcome:
    """A load job's reads finished. Only `ok` keys were copied into their primary slots;
    `corrupt` ones failed their checksum, `missing` ones vanished, `failed` ones hit an error."""

    job_id: int
    ok: tuple[BlockKey, ...]
    failed: tuple[BlockKey, ...] = ()
    corrupt: tuple[BlockKey, ...] = ()
    missing: tuple[BlockKey, ...] = ()
    num_bytes: int = 0
    duration_s: float = 0.0
    num_io_errors: int = 0


Outcome = StoreOutcome | LoadOutcome


@dataclass(slots=True)
class _Reads:
    """What one read batch found (mutable while the batch runs on its reader thread)."""

    ok: list[BlockKey]
    failed: list[BlockKey]
    corrupt: list[BlockKey]
    missing: list[BlockKey]
    num_io_errors: int = 0


class TierIO:
    """Runs the tier's LMDB work off the scheduler thread.

    Threading: `submit_*`, `take_outcomes`, `drain` and `close` are called by ONE owner thread
    (vLLM's scheduler thread). LMDB writes run on one writer thread (so `LMDBStore`'s single-
    writer rule holds), reads on `num_read_threads` readers; each posts its outcome to a
    thread-safe queue. A read copies a value into a per-thread scratch buffer, verifies its
    checksum there, and only then copies it into the primary slot, so bad bytes never reach it.
    """

    def __init__(
        self, store: LMDBStore, namespace: str, slots: PrimarySlots, num_read_threads: int
    ) -> None:
        self._store = store
        self._namespace = namespace
        self._slots = slots
        self._disk = DiskIO(store, namespace, slots)
        self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="lmdb-tier-w")
        self._readers = ThreadPoolExecutor(
            max_workers=num_read_threads, thread_name_prefix="lmdb-tier-r"
        )
        self._outcomes: queue.SimpleQueue[Outcome] = queue.SimpleQueue()
        self._scratch = threading.local()
        self._lock = threading.Lock()
        self._futures: set[Future[None]] = set()
        self._is_closed = False

    # -- submit (owner thread) ----------------------------------------------------------------

    def submit_store(
        self, job_id: int, items: Sequence[tuple[BlockKey, int]], victims: Sequence[BlockKey]
    ) -> None:
        """Delete `victims`, then write each (key, primary slot) in one transaction."""
        keys = tuple(key for key, _ in items)
        failure = StoreOutcome(job_id, (), keys, 0, 0.0, num_io_errors=1)
        self._submit(self._writer, lambda: self._write(job_id, items, victims), failure)

    def submit_load(self, job_id: int, items: Sequence[tuple[BlockKey, int]]) -> None:
        """Read each key into its primary slot, verifying its checksum first."""
        failure = LoadOutcome(job_id, (), failed=tuple(key for key, _ in items), num_io_errors=1)
        self._submit(self._readers, lambda: self._read(job_id, items), failure)

    def submit_delete(self, keys: Sequence[BlockKey]) -> None:
        if keys:
            self._submit(self._writer, lambda: self._disk.delete(list(keys)), None)

    def submit_touch(self, keys: Sequence[BlockKey]) -> None:
        """Record disk hits (last access, hit count) for `kvstore ls` and a restart's LRU."""
        if keys:
            self._submit(self._writer, lambda: self._disk.touch(list(keys)), None)

    def take_outcomes(self) -> list[Outcome]:
        outcomes: list[Outcome] = []
        while True:
            try:
                outcomes.append(self._outcomes.get_nowait())
            except queue.Empty:
                return outcomes

    # -- lifecycle (owner thread) -------------------------------------------------------------

    def drain(self, timeout_s: float | None = None) -> bool:
        """Wait until every submitted task has finished; False if `timeout_s` passed first."""
        with self._lock:
            pending = list(self._futures)
        _, not_done = wait(pending, timeout=timeout_s)
        return not not_done

    def close(self, timeout_s: float) -> list[str]:
        """Finish the queued work (up to `timeout_s`), stop the threads, sync and close the
        store. Returns the errors met, in order. If work is still running (it may be copying
        into the primary slots) nothing is closed, and a later call tries again."""
        self._is_closed = True  # refuse new work; what is queued still runs and reports
        if not self.drain(timeout_s):
            return [f"I/O still running after {timeout_s:.1f} s; the LMDB store is left open"]
        errors: list[str] = []
        steps: tuple[tuple[str, Callable[[], object]], ...] = (
            ("writer thread", lambda: self._writer.shutdown(wait=True)),
            ("reader threads", lambda: self._readers.shutdown(wait=True)),
            ("store", self._disk.close),  # sync, then close
            ("primary view", self._slots.release),
        )
        for name, step in steps:
            try:
                step()
            except Exception as exc:
                errors.append(f"{name}: {exc}")
        return errors

    # -- internals ----------------------------------------------------------------------------

    def _submit(
        self, executor: ThreadPoolExecutor, work: Callable[[], object], failure: Outcome | None
    ) -> None:
        def run() -> None:
            try:
                work()
            except Exception:
                logger.exception("LMDBTier I/O task failed")
                if failure is not None:
                    self._outcomes.put(failure)

        if self._is_closed:
            logger.warning("LMDBTier: I/O submitted after shutdown was refused")
            if failure is not None:
                self._outcomes.put(failure)
            return
        future = executor.submit(run)
        with self._lock:
            self._futures.add(future)
        future.add_done_callback(self._forget)

    def _forget(self, future: Future[None]) -> None:
        with self._lock:
            self._futures.discard(future)

    def _write(
        self, job_id: int, items: Sequence[tuple[BlockKey, int]], victims: Sequence[BlockKey]
    ) -> None:
        done, report = self._disk.write(items, victims)
        outcome = StoreOutcome(job_id, done.ok, done.failed, report.num_bytes, report.duration_s)
        self._outcomes.put(replace(outcome, num_io_errors=report.num_io_errors))

    def _read(self, job_id: int, items: Sequence[tuple[BlockKey, int]]) -> None:
        start_s = time.perf_counter()
        reads = _Reads([], [], [], [])
        scratch = self._scratch_view()
        slot_bytes = self._slots.slot_bytes
        for key, slot in items:
            if self._read_one(key, scratch, reads):
                self._slots.row(slot)[:] = scratch
        outcome = LoadOutcome(
            job_id,
            ok=tuple(reads.ok),
            failed=tuple(reads.failed),
            corrupt=tuple(reads.corrupt),
            missing=tuple(reads.missing),
            num_bytes=len(reads.ok) * slot_bytes,
            duration_s=time.perf_counter() - start_s,
            num_io_errors=reads.num_io_errors,
        )
        self._outcomes.put(outcome)

    def _read_one(self, key: BlockKey, scratch: memoryview, reads: _Reads) -> bool:
        """Read and verify `key` into `scratch`, recording the outcome in `reads`; True if ok."""
        try:
            size = self._store.get_into(self._namespace, key, scratch)
        except CorruptionError as exc:
            logger.warning("LMDBTier: chunk %s is corrupt on disk: %s", short_hex(key), exc)
            reads.corrupt.append(key)
            return False
        except TierConfigError as exc:  # larger than a slot: not a value this tier wrote
            logger.warning("LMDBTier: chunk %s has the wrong size: %s", short_hex(key), exc)
            reads.corrupt.append(key)
            return False
        except Exception as exc:  # lmdb.Error, OSError: an I/O error
            logger.error("LMDBTier: reading chunk %s failed: %s", short_hex(key), exc)
            reads.failed.append(key)
            reads.num_io_errors += 1
            return False
        if size is None:
            reads.missing.append(key)  # deleted by another process (`kvstore rm`, `gc`)
        elif size != scratch.nbytes:
            logger.warning("LMDBTier: chunk %s has %d bytes, not a slot", short_hex(key), size)
            reads.corrupt.append(key)
        else:
            reads.ok.append(key)
            return True
        return False

    def _scratch_view(self) -> memoryview:
        view: memoryview | None = getattr(self._scratch, "view", None)
        if view is None:
            view = memoryview(bytearray(self._slots.slot_bytes))
            self._scratch.view = view
        return view
