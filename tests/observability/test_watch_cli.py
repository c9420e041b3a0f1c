"""`kvstore watch` against a live publisher: JSON lines, the table, timeouts and usage errors."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from itertools import count
from pathlib import Path
from typing import TypeVar

import pytest
from typer.testing import CliRunner

from kvstore.cli import app
from kvstore.eventbus import EventBus, ZMQPublisherSink
from kvstore.events import ChunkRemoved, ChunkStored, TierEvent
from kvstore.keys import BlockKey, Tier
from tests.support.net import free_port

runner = CliRunner()
T = TypeVar("T")


def event(i: int) -> TierEvent:
    key = BlockKey(i.to_bytes(8, "big") * 4)
    if i % 2:
        return ChunkRemoved(Tier.DISK, (key,), float(i))
    return ChunkStored(Tier.CPU, (key, key), 16, float(i), token_ids=tuple(range(32)))


@pytest.fixture
async def publisher() -> AsyncIterator[tuple[str, EventBus]]:
    port = free_port()
    bus = EventBus([ZMQPublisherSink(f"tcp://*:{port}", int_block_hashes=False)])
    await bus.start()
    yield f"tcp://127.0.0.1:{port}", bus
    await bus.close()


async def run_while_publishing(bus: EventBus, invoke: Callable[[], T]) -> T:
    """Publish one event every 20 ms until the watcher exits (a SUB misses what came before it
    connected, so the watcher sees some suffix of the stream)."""
    task = asyncio.create_task(asyncio.to_thread(invoke))
    numbers = count()
    while not task.done():
        bus.publish([event(next(numbers))])
        await asyncio.wait([task], timeout=0.02)
    return task.result()


async def test_json_lines_for_count_events(publisher: tuple[str, EventBus]) -> None:
    endpoint, bus = publisher
    args = ["watch", endpoint, "--json", "--count", "5", "--timeout-s", "10"]
    result = await run_while_publishing(bus, lambda: runner.invoke(app, args))
    assert result.exit_code == 0, result.output
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    assert len(lines) == 5
    seqs = [line["seq"] for line in lines]
    assert seqs == sorted(seqs)
    numbers = [int.from_bytes(bytes.fromhex(line["block_hashes"][0])[:8], "big") for line in lines]
    assert numbers == list(range(numbers[0], numbers[0] + 5))
    for i, line in zip(numbers, lines, strict=True):
        assert line["block_hashes"][0] == (i.to_bytes(8, "big") * 4).hex()
        if i % 2:
            assert (line["type"], line["medium"], line["num_blocks"]) == (
                "BlockRemoved",
                "STORAGE",
                1,
            )
        else:
            assert (line["type"], line["medium"], line["num_blocks"]) == ("BlockStored", "CPU", 2)
            assert (line["block_size"], line["num_tokens"]) == (16, 32)
    assert "watching" in result.stderr


async def test_table_rows(publisher: tuple[str, EventBus]) -> None:
    endpoint, bus = publisher
    args = ["watch", endpoint, "--count", "4", "--timeout-s", "10"]
    result = await run_while_publishing(bus, lambda: runner.invoke(app, args))
    assert result.exit_code == 0, result.output
    header, *rows = result.stdout.splitlines()
    assert header.split() == ["SEQ", "TIME", "TYPE", "MEDIUM", "BLOCKS", "HASH"]
    assert len(rows) == 4
    assert {row.split()[2] for row in rows} == {"BlockStored", "BlockRemoved"}
    assert {row.split()[3] for row in rows} == {"CPU", "STORAGE"}


def test_a_silent_stream_times_out_with_exit_1(tmp_path: Path) -> None:
    endpoint = f"ipc://{tmp_path}/nobody.sock"
    args = ["watch", endpoint, "--json", "--count", "2", "--timeout-s", "0.3"]
    result = runner.invoke(app, args)
    assert result.exit_code == 1
    assert "0/2 events" in result.stderr
    assert result.stdout == ""


@pytest.mark.parametrize(
    "args", [["watch", "localhost:5557"], ["watch", "tcp://h:1", "--count", "0"], ["watch"]]
)
def test_usage_errors_exit_2(args: list[str]) -> None:
    assert runner.invoke(app, args).exit_code == 2


async def test_the_installed_command_keeps_stdout_to_json(
    publisher: tuple[str, EventBus],
) -> None:
    endpoint, bus = publisher
    kvstore = Path(sys.executable).with_name("kvstore")
    cmd = [str(kvstore), "watch", endpoint, "--json", "--count", "3", "--timeout-s", "60"]
    env = {**os.environ, "COLUMNS": "60"}

    def invoke() -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            cmd, capture_output=True, text=True, timeout=120, env=env, check=False
        )

    done = await run_while_publishing(bus, invoke)
    assert done.returncode == 0, done.stderr
    assert len([json.loads(line)["type"] for line in done.stdout.splitlines()]) == 3
    assert "watching" in done.stderr


async def test_replay_prints_the_buffered_events_first_then_live_ones(tmp_path: Path) -> None:
    sink = ZMQPublisherSink(
        f"ipc://{tmp_path}/pub.sock",
        replay_endpoint=f"ipc://{tmp_path}/replay.sock",
        int_block_hashes=True,
    )
    bus = EventBus([sink])
    await bus.start()
    try:
        for i in range(3):  # before anyone listens: only the replay buffer has them
            bus.publish([event(i)])
            while sink.next_seq <= i:
                await asyncio.sleep(0.005)
        args = [
            "watch", f"ipc://{tmp_path}/pub.sock", "--replay-endpoint",
            f"ipc://{tmp_path}/replay.sock", "--json", "--count", "6", "--timeout-s", "10",
        ]  # fmt: skip
        result = await run_while_publishing(bus, lambda: runner.invoke(app, args))
    finally:
        await bus.close()
    assert result.exit_code == 0, result.output
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    seqs = [line["seq"] for line in lines]
    assert seqs[:3] == [0, 1, 2]
    assert seqs == sorted(set(seqs)) and len(seqs) == 6
    # int hashes print as 16 hex digits: the low 64 bits of the key
    assert lines[1]["block_hashes"] == [(1).to_bytes(8, "big").hex()]
