"""`InlineTierService`: the tier service's contract with no threads, for deterministic runs.

`TierPipeline` drives a service through `submit_*`, `drain_completions` and `publish`. The
real `TierService` runs the disk work on an asyncio loop and executor threads; this one runs the
same `DiskIO` operations on the caller's thread, so a replay (`kvstore simulate`) or a unit test
sees exactly one order of events. Work submitted is queued; `run_pending()` runs it (or, with
`is_deferred=False`, it runs at submit) and its completion is drained by the pipeline's next
`poll`, as with the real service. Queue limits, the remote tier's I/O and metrics are the real
service's business; `fail_next_writes`/`fail_next_promotions` plant failures for tests.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from kvstore.events import TierEvent
from kvstore.keys import BlockKey
from kvstore.service.completions import Completion, PromotionDone, WriteDone
from kvstore.service.disk_io import DiskIO

__all__ = ["InlineTierService"]


class InlineTierService:
    """See the module docstring. Threading: one thread calls everything."""

    def __init__(self, disk: DiskIO | None, *, is_deferred: bool = True) -> None:
        self._disk = disk
        self._is_deferred = is_deferred
        self._pending: list[Callable[[], Completion | None]] = []
        self._completions: list[Completion] = []
        self.published: list[TierEvent] = []
        self.touched: list[BlockKey] = []
        self.num_fail_writes = 0
        self.num_fail_promotions = 0

    @property
    def has_disk(self) -> bool:
        return self._disk is not None

    @property
    def remote(self) -> None:
        return None

    @property
    def num_pending(self) -> int:
        return len(self._pending)

    def submit_write(
        self, items: Sequence[tuple[BlockKey, int]], victims: Sequence[BlockKey]
    ) -> bool:
        disk = self._disk
        if disk is None:
            return False
        items, victims = list(items), list(victims)

        def write() -> Completion:
            if self.num_fail_writes:
                self.num_fail_writes -= 1
                return WriteDone(ok=(), failed=tuple(key for key, _ in items))
            return disk.write(items, victims)[0]

        return self._submit(write)

    def submit_promotion(self, items: Sequence[tuple[BlockKey, int]], tag: object = None) -> bool:
        disk = self._disk
        if disk is None:
            return False
        items = list(items)

        def read() -> Completion:
            if self.num_fail_promotions:
                self.num_fail_promotions -= 1
                return PromotionDone(ok=(), failed=tuple(key for key, _ in items), tag=tag)
            done = disk.read(items)[0]
            return PromotionDone(done.ok, done.failed, done.corrupt, done.missing, tag)

        return self._submit(read)

    def submit_delete(self, keys: Sequence[BlockKey]) -> None:
        disk = self._disk
        if disk is not None:
            keys = list(keys)

            def delete() -> None:
                disk.delete(keys)

            self._submit(delete)

    def submit_touch(self, keys: Sequence[BlockKey]) -> None:
        self.touched.extend(keys)

    def publish(self, events: Sequence[TierEvent]) -> None:
        self.published.extend(events)

    def run_pending(self) -> int:
        """Run the work submitted so far (in order); the number of operations run."""
        work, self._pending = self._pending, []
        for run in work:
            done = run()
            if done is not None:
                self._completions.append(done)
        return len(work)

    def drain_completions(self) -> list[Completion]:
        done, self._completions = self._completions, []
        return done

    def _submit(self, run: Callable[[], Completion | None]) -> bool:
        self._pending.append(run)
        if not self._is_deferred:
            self.run_pending()
        return True
