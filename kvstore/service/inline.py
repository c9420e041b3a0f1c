"""`InlineTierService`: the tier service's contract with no threads, for deterministic runs.

`TierPipeline` drives a service through `submit_*`, `drain_completions` and `publish`. The
real `TierService` runs the disk work on an asyncio loop and executor threads; this one runs the
same `DiskIO` operations on the caller's thread, so a replay (`kvstore simulate`) or a unit test
sees exactly one order of events. Work submitted is queued; `run_pending()` runs it (or, with
`is_deferred=False`, it runs at submit) and its completion is drained by the pipeline's next
`poll`, as with the real service. A remote tier (`remote`: a `SharedRemote`, which several services
may share) gets an `InlineRemoteIO` whose work joins the same queue. Queue limits and metrics are
the real service's business; `num_fail_writes`/`num_fail_promotions` plant failures for tests.
`published` and `touched` keep what the pipeline handed over (unless `is_recording=False`, for long
replays); `num_promoted_chunks` counts the chunks promotions read into CPU rows.
"""

from __future__ import annotations

from collections.abc import Sequence

from kvstore.events import TierEvent
from kvstore.keys import BlockKey
from kvstore.service.completions import Completion, PromotionDone, WriteDone
from kvstore.service.disk_io import DiskIO, RowBuffers
from kvstore.service.inline_remote import InlineRemoteIO, SharedRemote, Work

__all__ = ["InlineTierService"]


class InlineTierService:
    """See the module docstring. Threading: one thread calls everything."""

    def __init__(
        self,
        disk: DiskIO | None,
        *,
        remote: SharedRemote | None = None,
        remote_rows: RowBuffers | None = None,
        is_deferred: bool = True,
        is_recording: bool = True,
    ) -> None:
        self._disk = disk
        self._is_deferred = is_deferred
        self._is_recording = is_recording
        self._pending: list[Work] = []
        self._completions: list[Completion] = []
        self._remote: InlineRemoteIO | None = None
        if remote is not None:
            if remote_rows is None:
                raise ValueError("a remote tier needs remote_rows (the CPU region)")
            self._remote = InlineRemoteIO(remote, remote_rows, self._submit)
        self.published: list[TierEvent] = []
        self.touched: list[BlockKey] = []
        self.num_fail_writes = 0
        self.num_fail_promotions = 0
        self.num_promoted_chunks = 0

    @property
    def has_disk(self) -> bool:
        return self._disk is not None

    @property
    def remote(self) -> InlineRemoteIO | None:
        return self._remote

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

        def write() -> list[Completion]:
            if self.num_fail_writes:
                self.num_fail_writes -= 1
                return [WriteDone(ok=(), failed=tuple(key for key, _ in items))]
            return [disk.write(items, victims)[0]]

        return self._submit(write)

    def submit_promotion(self, items: Sequence[tuple[BlockKey, int]], tag: object = None) -> bool:
        disk = self._disk
        if disk is None:
            return False
        items = list(items)

        def read() -> list[Completion]:
            if self.num_fail_promotions:
                self.num_fail_promotions -= 1
                return [PromotionDone(ok=(), failed=tuple(key for key, _ in items), tag=tag)]
            done = disk.read(items)[0]
            self.num_promoted_chunks += len(done.ok)
            return [PromotionDone(done.ok, done.failed, done.corrupt, done.missing, tag)]

        return self._submit(read)

    def submit_delete(self, keys: Sequence[BlockKey]) -> None:
        disk = self._disk
        if disk is not None:
            keys = list(keys)

            def delete() -> list[Completion]:
                disk.delete(keys)
                return []

            self._submit(delete)

    def submit_touch(self, keys: Sequence[BlockKey]) -> None:
        if self._is_recording:
            self.touched.extend(keys)

    def publish(self, events: Sequence[TierEvent]) -> None:
        if self._is_recording:
            self.published.extend(events)

    def run_pending(self) -> int:
        """Run the work submitted so far (in order); the number of operations run."""
        work, self._pending = self._pending, []
        for run in work:
            self._completions.extend(run())
        return len(work)

    def drain_completions(self, timeout_s: float = 0.0) -> list[Completion]:
        """The results so far (work runs in `run_pending`, on this thread: nothing to wait on)."""
        done, self._completions = self._completions, []
        return done

    def _submit(self, run: Work) -> bool:
        self._pending.append(run)
        if not self._is_deferred:
            self.run_pending()
        return True
