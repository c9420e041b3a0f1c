"""The writer thread's queue (loop-thread state of `TierService`): jobs in order, consecutive
writes merged into one batch (one LMDB transaction), and a hold that keeps everything queued
until released (the connector's disk namespace is registered first)."""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Callable
from dataclasses import dataclass

from kvstore.keys import BlockKey

__all__ = ["WriteJob", "WriteQueue"]

WRITE_BATCH_CHUNKS = 64


@dataclass(frozen=True, slots=True)
class WriteJob:
    items: list[tuple[BlockKey, int]]
    victims: list[BlockKey]
    call: Callable[[], object] | None = None
    num_jobs: int = 1  # the submitted jobs this one stands for (a batch merges several)


class WriteQueue:
    """Created and used on the service's loop thread only."""

    def __init__(self, *, is_held: bool = False) -> None:
        self.is_held = is_held  # until release()
        self._jobs: collections.deque[WriteJob] = collections.deque()
        self._has_work = asyncio.Event()
        self.idle = asyncio.Event()  # set while no job is queued or running on the writer
        self.idle.set()

    def __len__(self) -> int:
        return len(self._jobs)

    def append(self, job: WriteJob) -> None:
        self.idle.clear()
        self._jobs.append(job)
        self._has_work.set()

    def release(self, first: WriteJob | None) -> None:
        """End the hold; `first` runs before everything queued."""
        if first is not None:
            self.idle.clear()
            self._jobs.appendleft(first)
        self.is_held = False
        self._has_work.set()

    def take_all(self) -> list[WriteJob]:
        jobs = list(self._jobs)
        self._jobs.clear()
        return jobs

    async def next_batch(self) -> WriteJob:
        """The next job (not while held); consecutive writes merge into one batch."""
        jobs = self._jobs
        while not jobs or self.is_held:
            self._has_work.clear()
            await self._has_work.wait()
        job = jobs.popleft()
        if job.call is not None:
            return job
        items, victims, num_jobs = list(job.items), list(job.victims), job.num_jobs
        while len(items) < WRITE_BATCH_CHUNKS and jobs and jobs[0].call is None:
            more = jobs.popleft()  # a call stays queued: it runs after this batch, in order
            items += more.items
            victims += more.victims
            num_jobs += more.num_jobs
        return WriteJob(items, victims, num_jobs=num_jobs)
