"""An in-memory remote tier shared by several pipelines, and each one's I/O to it, with no threads.

`SharedRemote` is the remote tier as Redis runs it with `maxmemory` and `allkeys-lru`: a probe
(EXISTS) is not an access, a fetch (GET), a write (SET) and a TOUCH are; writes past capacity evict
the least recently used chunks. Exact LRU (Redis samples keys to approximate it); capacity counts
whole chunks (the 40-byte value header and Redis's per-key overhead, well under 1% of a chunk, are
left out); a batch of writes evicts once it is all written (Redis evicts before each SET of the
pipeline, so a batch that rewrites the least recently used chunk would evict one more). Values are
the bytes of the rows written (a replay may use rows much smaller than a chunk).

`InlineRemoteIO` is one engine's connection to it, with the contract of
`kvstore.service.remote_io.RemoteIO` (`kvstore.pipeline.remote.RemoteTierIO`): its work is queued
on the owning `InlineTierService` and answered through that service's completions. Writes always
land (no queue limit, no breaker). Redis's own removals reach the connection whose write caused
them (the real watcher reports each one to every engine; here each eviction is reported once, by
its cause, so counts over several engines add up).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from kvstore.keys import BlockKey
from kvstore.policies import LRUPolicy
from kvstore.service.completions import (
    Completion,
    RemoteFetchDone,
    RemoteMeasureDone,
    RemoteProbeDone,
    RemoteRemoved,
    RemoteWriteDone,
)
from kvstore.service.disk_io import RowBuffers

__all__ = ["InlineRemoteIO", "SharedRemote", "Work"]

Work = Callable[[], Sequence[Completion]]
"""A unit of queued work: run on the caller's thread, it returns its completions."""


class SharedRemote:
    """See the module docstring. Threading: one thread calls everything."""

    def __init__(self, num_chunks: int) -> None:
        if num_chunks < 1:
            raise ValueError(f"a remote tier holds at least one chunk, got {num_chunks}")
        self.num_chunks = num_chunks
        self._values: dict[BlockKey, bytes] = {}
        self._order = LRUPolicy()

    def __len__(self) -> int:
        return len(self._values)

    def exists(self, keys: Sequence[BlockKey]) -> list[bool]:
        """Which of `keys` are held (EXISTS: not an access)."""
        return [key in self._values for key in keys]

    def get(self, key: BlockKey) -> bytes | None:
        """The value of `key`, or None (GET: an access)."""
        value = self._values.get(key)
        if value is not None:
            self._order.touch(key)
        return value

    def touch(self, keys: Sequence[BlockKey]) -> None:
        """TOUCH: an access to each held key, without reading it."""
        for key in keys:
            if key in self._values:
                self._order.touch(key)

    def set_many(self, items: Sequence[tuple[BlockKey, bytes]]) -> list[BlockKey]:
        """Hold each (key, value) (SET: an access), then evict down to capacity; returns the
        keys evicted (least recently used first)."""
        for key, value in items:
            self._values[key] = value
            self._order.insert(key)
        excess = len(self._values) - self.num_chunks
        if excess <= 0:
            return []
        evicted = self._order.evict(excess, frozenset()) or []
        for gone in evicted:
            del self._values[gone]
        return evicted


class InlineRemoteIO:
    """See the module docstring. `submit` queues work on the owning service."""

    def __init__(
        self, tier: SharedRemote, rows: RowBuffers, submit: Callable[[Work], bool]
    ) -> None:
        self._tier = tier
        self._rows = rows
        self._submit = submit

    def submit_probe(self, keys: Sequence[BlockKey], tag: object) -> None:
        keys = tuple(keys)
        self._submit(lambda: [RemoteProbeDone(keys, tuple(self._tier.exists(keys)), tag)])

    def submit_fetch(self, items: Sequence[tuple[BlockKey, int]], tag: object) -> None:
        items = list(items)
        self._submit(lambda: [self._fetch(items, tag)])

    def submit_measure(self, keys: Sequence[BlockKey], tag: object) -> None:
        keys = tuple(keys)
        self._submit(lambda: [self._measure(keys, tag)])

    def submit_write(self, items: Sequence[tuple[BlockKey, int]]) -> bool:
        items = list(items)
        return self._submit(lambda: self._write(items))

    def submit_touch(self, keys: Sequence[BlockKey]) -> None:
        keys = tuple(keys)
        self._submit(lambda: self._touch(keys))

    def _touch(self, keys: tuple[BlockKey, ...]) -> list[Completion]:
        self._tier.touch(keys)
        return []

    def _fetch(self, items: list[tuple[BlockKey, int]], tag: object) -> RemoteFetchDone:
        start_s = time.monotonic()
        ok: list[BlockKey] = []
        failed: list[BlockKey] = []
        num_bytes = 0
        for key, row in items:
            value = self._tier.get(key)
            target = self._rows.row(row)
            if value is None or len(value) != target.nbytes:  # gone, or not one of our rows
                failed.append(key)
                continue
            target[:] = value
            ok.append(key)
            num_bytes += len(value)
        return RemoteFetchDone(
            tuple(ok), tuple(failed), tag, num_bytes=num_bytes,
            duration_s=time.monotonic() - start_s,
        )  # fmt: skip

    def _measure(self, keys: tuple[BlockKey, ...], tag: object) -> RemoteMeasureDone:
        start_s = time.monotonic()
        values = [self._tier.get(key) for key in keys]
        num_bytes = sum(len(value) for value in values if value is not None)
        return RemoteMeasureDone(num_bytes, time.monotonic() - start_s, tag)

    def _write(self, items: list[tuple[BlockKey, int]]) -> list[Completion]:
        evicted = self._tier.set_many([(key, bytes(self._rows.row(row))) for key, row in items])
        done: list[Completion] = [RemoteWriteDone(tuple(key for key, _ in items))]
        if evicted:  # Redis reports its removals after the writes' replies
            done.append(RemoteRemoved(tuple(evicted)))
        return done
