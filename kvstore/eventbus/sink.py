"""The plug point for event consumers."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from kvstore.events import TierEvent

__all__ = ["EventSink"]


@runtime_checkable
class EventSink(Protocol):
    """Where the bus delivers events. All methods run on the bus's event loop.

    `start` opens what the sink needs (sockets, files, its own tasks); `write` takes one batch in
    publish order and may be slow (the bus queues in front of it); `close` flushes and releases
    everything, and is called once, after the last `write`, even if `start` failed.
    """

    @property
    def name(self) -> str:
        """A fixed, short name: the `sink` metric label (never derived from data)."""
        ...

    async def start(self) -> None: ...

    async def write(self, batch: Sequence[TierEvent]) -> None: ...

    async def close(self) -> None: ...
