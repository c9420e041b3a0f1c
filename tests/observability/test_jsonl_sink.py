"""JSONLSink: one JSON object per event, rotated by size, a line never split."""

from __future__ import annotations

import json
from pathlib import Path

from kvstore.eventbus import EventBus, JSONLSink, event_to_json
from kvstore.events import ChunkRemoved, ChunkStored
from kvstore.keys import BlockKey, Tier


def stored(i: int) -> ChunkStored:
    key = BlockKey(i.to_bytes(16, "big"))
    return ChunkStored(Tier.DISK, (key,), 32, float(i), parent_key=BlockKey(b"\x01" * 16))


def test_event_records() -> None:
    assert event_to_json(stored(7)) == {
        "ts": 7.0,
        "type": "stored",
        "tier": "disk",
        "medium": "STORAGE",
        "keys": [(7).to_bytes(16, "big").hex()],
        "num_tokens": 32,
        "num_tokens_per_chunk": 32,
        "parent": "01" * 16,
    }
    removed = ChunkRemoved(Tier.CPU, (BlockKey(b"\xab"), BlockKey(b"\xcd")), 1.5, "deleted")
    assert event_to_json(removed) == {
        "ts": 1.5,
        "type": "removed",
        "tier": "cpu",
        "medium": "CPU",
        "keys": ["ab", "cd"],
        "reason": "deleted",
    }


async def test_rotates_by_size_and_keeps_num_backups(tmp_path: Path) -> None:
    path = tmp_path / "logs" / "events.jsonl"
    line_bytes = len(json.dumps(event_to_json(stored(0)), separators=(",", ":"))) + 1
    sink = JSONLSink(path, max_bytes=10 * line_bytes, num_backups=2)
    bus = EventBus([sink], max_events_per_write=7)
    await bus.start()
    for start in range(0, 100, 5):
        bus.publish([stored(i) for i in range(start, start + 5)])
    assert await bus.close() == []
    files = [path, path.with_name("events.jsonl.1"), path.with_name("events.jsonl.2")]
    assert not path.with_name("events.jsonl.3").exists()
    assert sink.num_rotations >= 9
    kept: list[float] = []
    for file in reversed(files):  # oldest first
        data = file.read_bytes()
        assert len(data) <= 10 * line_bytes
        assert data.endswith(b"\n")
        kept.extend(json.loads(line)["ts"] for line in data.splitlines())
    assert len(kept) >= 27  # three files of nine or ten lines
    assert kept == [float(i) for i in range(100 - len(kept), 100)]


async def test_appends_to_an_existing_log_and_zero_backups_truncates(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    for _ in range(2):
        sink = JSONLSink(path, max_bytes=1 << 20, num_backups=0)
        await sink.start()
        await sink.write([stored(1)])
        await sink.close()
    assert len(path.read_text().splitlines()) == 2
    sink = JSONLSink(path, max_bytes=1, num_backups=0)
    await sink.start()
    await sink.write([stored(2), stored(3)])
    await sink.close()
    assert [json.loads(x)["ts"] for x in path.read_text().splitlines()] == [3.0]
    assert list(tmp_path.iterdir()) == [path]
