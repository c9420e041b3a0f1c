"""A JSONL log of events, written with aiofiles and rotated by size (path → path.1 → ...)."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import aiofiles
import aiofiles.os
from aiofiles.threadpool.binary import AsyncBufferedIOBase

from kvstore.errors import ConfigError
from kvstore.eventbus.wire import MEDIUM_BY_TIER
from kvstore.events import ChunkStored, TierEvent
from kvstore.keys import Tier

__all__ = ["JSONLSink", "event_to_json"]


def event_to_json(event: TierEvent) -> dict[str, Any]:
    """One event as the JSONL log writes it (keys as hex; no token ids)."""
    tier = Tier(event.tier)
    record: dict[str, Any] = {
        "ts": event.ts_s,
        "type": "stored" if isinstance(event, ChunkStored) else "removed",
        "tier": tier.value,
        "medium": MEDIUM_BY_TIER[tier],
        "keys": [key.hex() for key in event.keys],
    }
    if isinstance(event, ChunkStored):
        record["num_tokens"] = len(event.keys) * event.num_tokens_per_chunk
        record["num_tokens_per_chunk"] = event.num_tokens_per_chunk
        record["parent"] = None if event.parent_key is None else event.parent_key.hex()
    else:
        record["reason"] = event.reason
    return record


class JSONLSink:
    """Appends one JSON object per event to `path`; rotates when it would pass `max_bytes`.

    On rotation `path.{n-1}` → `path.{n}` ... `path` → `path.1`, keeping `num_backups` old files
    (0: the log is truncated). A line is never split across files.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        max_bytes: int = 64 << 20,
        num_backups: int = 3,
        name: str = "jsonl",
    ) -> None:
        if max_bytes < 1:
            raise ConfigError(f"events log max_bytes must be >= 1, got {max_bytes}")
        if num_backups < 0:
            raise ConfigError(f"events log num_backups must be >= 0, got {num_backups}")
        self._name = name
        self.path = Path(path)
        self.max_bytes = max_bytes
        self.num_backups = num_backups
        self._file: AsyncBufferedIOBase | None = None
        self._size_bytes = 0
        self.num_rotations = 0

    @property
    def name(self) -> str:
        return self._name

    async def start(self) -> None:
        await aiofiles.os.makedirs(self.path.parent, exist_ok=True)
        await self._open()

    async def write(self, batch: Sequence[TierEvent]) -> None:
        if self._file is None:
            raise RuntimeError(f"JSONL sink {self.path} is not open")
        pending = bytearray()
        for event in batch:
            line = json.dumps(event_to_json(event), separators=(",", ":")).encode() + b"\n"
            size = self._size_bytes + len(pending)
            if size > 0 and size + len(line) > self.max_bytes:
                await self._write(bytes(pending))
                pending.clear()
                await self._rotate()
            pending += line
        await self._write(bytes(pending))
        await self._file.flush()

    async def close(self) -> None:
        if self._file is not None:
            file, self._file = self._file, None
            await file.close()

    async def _open(self) -> None:
        self._file = await aiofiles.open(self.path, "ab")
        self._size_bytes = await self._file.tell()

    async def _write(self, data: bytes) -> None:
        if data and self._file is not None:
            await self._file.write(data)
            self._size_bytes += len(data)

    async def _rotate(self) -> None:
        await self.close()
        if self.num_backups == 0:
            await aiofiles.os.remove(self.path)
        else:
            for i in range(self.num_backups - 1, 0, -1):
                older = self._backup(i)
                if await aiofiles.os.path.exists(older):
                    await aiofiles.os.replace(older, self._backup(i + 1))
            await aiofiles.os.replace(self.path, self._backup(1))
        self.num_rotations += 1
        await self._open()

    def _backup(self, i: int) -> Path:
        return self.path.with_name(f"{self.path.name}.{i}")
