"""`DiskPipeline`: the pipeline's disk-only configuration, which `LMDBTier` drives.

Here vLLM's own offloading owns the CPU rows (the slots of its primary CPU tier): a store
writes rows vLLM pinned for the job to disk, a load reads disk chunks into rows vLLM allocated.
The rest is the pipeline's, shared with `TierPipeline`: placement by bytes with pins and an
eviction policy (`DiskIndex`), the I/O off the caller's thread (the tier service), and the disk
rules (`DiskSteps`: queueing, roll-back of refused work, completions, discard reasons, when a
disk record is touched). Observers (`PipelineObserver`: kvstore's metrics) see lookups, failed
loads and events as they do from `TierPipeline`.

Rules of this configuration: a lookup hit is protected from eviction until the step ends
(`end_step`; by then vLLM has prepared its load, which pins it); a chunk a load cannot pin, or
whose read does not land, is a failed load (counted; vLLM recomputes it).

Threading: one caller at a time (vLLM calls `LMDBTier` under its tiering manager's lock) calls
everything; the service's results are applied at `poll` (or `drain`), so the index stays
single-threaded.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

from kvstore.events import TierEvent
from kvstore.index.disk import DiskCandidate, DiskIndex
from kvstore.index.event_log import EventLog
from kvstore.keys import BlockKey, Tier
from kvstore.pipeline.disk_steps import DiskSteps, DiskSubmitter, IndexedDisk
from kvstore.pipeline.observers import Observers, PipelineObserver
from kvstore.service.completions import Completion, PromotionDone, WriteDone

__all__ = ["DiskLoadPlan", "DiskPipeline", "DiskService", "DiskStorePlan"]

DiskDone = WriteDone | PromotionDone


class DiskService(DiskSubmitter, Protocol):
    """What the disk-only pipeline asks of the tier service (`TierService`)."""

    @property
    def has_disk(self) -> bool: ...

    @property
    def is_disk_up(self) -> bool: ...

    def submit_call(self, fn: Callable[[], object]) -> None: ...

    def publish(self, events: Sequence[TierEvent]) -> None: ...

    def drain_completions(self, timeout_s: float = 0.0) -> list[Completion]: ...


@dataclass(frozen=True, slots=True)
class DiskStorePlan:
    """`keys` are being written (a `WriteDone` ends each); `skipped` did not fit (no room, or
    still leaving the tier); `is_refused`: the service refused the write, nothing is written."""

    keys: tuple[BlockKey, ...] = ()
    skipped: tuple[BlockKey, ...] = ()
    is_refused: bool = False


@dataclass(frozen=True, slots=True)
class DiskLoadPlan:
    """`keys` are being read (one `PromotionDone` carrying the tag ends them all); `missing`
    were not ready on disk; `is_refused`: the service refused the read."""

    keys: tuple[BlockKey, ...] = ()
    missing: tuple[BlockKey, ...] = ()
    is_refused: bool = False


class DiskPipeline:
    """See the module docstring."""

    def __init__(
        self,
        index: DiskIndex,
        log: EventLog,
        service: DiskService,
        observers: Sequence[PipelineObserver] = (),
        *,
        num_tokens_per_chunk: int,
    ) -> None:
        self._index = index
        self._log = log  # the index's events
        self._service = service
        self._observers = Observers(observers, service.publish)
        self._num_tokens_per_chunk = num_tokens_per_chunk
        self._steps = DiskSteps(service, IndexedDisk(index))
        self._protected: set[BlockKey] = set()  # this step's lookup hits
        self._writing: set[BlockKey] = set()
        self._num_reads = 0
        self._finished: list[DiskDone] = []  # applied, not yet handed out by `poll`

    @property
    def index(self) -> DiskIndex:
        return self._index

    @property
    def is_busy(self) -> bool:
        """Whether a write or read waits for the service."""
        return bool(self._writing or self._num_reads)

    # -- lookups ----------------------------------------------------------------------------

    def lookup(self, key: BlockKey) -> bool:
        """Whether the chunk is servable from disk (one still being written is not: its
        bytes are in the caller's rows). A hit is protected until `end_step`."""
        is_hit = self._index.is_ready(key)
        if is_hit:
            self._protected.add(key)
        tokens = self._num_tokens_per_chunk
        self._observers.record_lookup(1, tokens, {Tier.DISK: (1, tokens)} if is_hit else {})
        return is_hit

    def end_step(self) -> None:
        """The step's loads are prepared (and pinned): its lookup hits are no longer protected."""
        self._protected.clear()

    def touch(self, keys: Iterable[BlockKey]) -> None:
        """An access to each chunk, for the eviction policy."""
        self._index.touch(keys)

    # -- stores and loads -------------------------------------------------------------------

    def prepare_store(self, items: Sequence[tuple[BlockKey, int]]) -> DiskStorePlan:
        """Reserve room (evicting by bytes, never a pinned chunk or this step's hits) for the
        chunks not on disk yet, and queue their writes from the given rows (key, row)."""
        row_of = dict(items)
        plan = self._index.reserve((DiskCandidate(key) for key in row_of), self._protected)
        self._pump_events()
        if not self._steps.write([(key, row_of[key]) for key in plan.keys], plan.evicted):
            return DiskStorePlan(skipped=plan.skipped, is_refused=True)
        self._writing.update(plan.keys)
        return DiskStorePlan(plan.keys, plan.skipped)

    def prepare_load(self, items: Sequence[tuple[BlockKey, int]], *, tag: object) -> DiskLoadPlan:
        """Pin the chunks ready on disk and queue their reads into the given rows (key, row);
        the result comes back from `poll` as one `PromotionDone` carrying `tag`."""
        pinned = self._index.pin(key for key, _ in items)
        reads = [item for item, is_pinned in zip(items, pinned, strict=True) if is_pinned]
        missing = tuple(key for (key, _), is_pinned in zip(items, pinned, strict=True)
                        if not is_pinned)  # fmt: skip
        self._observers.record_load_failure(len(missing))
        if not reads:
            return DiskLoadPlan(missing=missing)
        if not self._steps.read(reads, tag):
            self._observers.record_load_failure(len(reads))
            return DiskLoadPlan(missing=missing, is_refused=True)
        self._num_reads += 1
        return DiskLoadPlan(tuple(key for key, _ in reads), missing)

    # -- completions, events ----------------------------------------------------------------

    def poll(self) -> list[DiskDone]:
        """Apply the service's finished work; returns every result applied since the last
        call (the caller maps them onto its jobs)."""
        self._apply(self._service.drain_completions())
        finished, self._finished = self._finished, []
        return finished

    def drain(self, timeout_s: float) -> bool:
        """Block until every write and read submitted has finished and been applied, and the
        disk work they caused (deletes of evicted and corrupt chunks) has run; False if
        `timeout_s` passed first. Waits on the service's results, never spins; not for the
        step path. The results wait for the next `poll`."""
        deadline_s = time.monotonic() + timeout_s
        while self.is_busy:
            remaining_s = deadline_s - time.monotonic()
            if remaining_s <= 0:
                return False
            self._apply(self._service.drain_completions(timeout_s=remaining_s))
        service = self._service
        if not (service.has_disk and service.is_disk_up):
            return True
        ran = threading.Event()
        service.submit_call(ran.set)  # runs after every queued write and delete
        return ran.wait(max(0.0, deadline_s - time.monotonic()))

    def take_events(self) -> list[TierEvent]:
        """Placement events since the last call (already counted by every observer)."""
        self._pump_events()
        return self._observers.take_events()

    def _apply(self, completions: Sequence[Completion]) -> None:
        for done in completions:
            if isinstance(done, WriteDone):
                self._steps.finish_write(done)
                self._writing.difference_update(done.ok + done.failed)
            elif isinstance(done, PromotionDone):
                self._num_reads -= 1
                self._observers.record_load_failure(len(self._steps.finish_read(done)))
                self._steps.served(done.ok)
            else:
                continue  # no remote tier in this configuration
            self._finished.append(done)
        self._pump_events()

    def _pump_events(self) -> None:
        self._observers.record_events(self._log.take())
