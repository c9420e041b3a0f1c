"""The ZMQ stream is vLLM's wire format: vLLM's own KVEventBatch decoder reads it."""

from __future__ import annotations

import asyncio

import msgspec
import pytest
import zmq
import zmq.asyncio

from kvstore.eventbus import EventBus, ZMQPublisherSink, decode_batch
from kvstore.eventbus.wire import END_SEQ, block_hash_to_wire
from kvstore.events import ChunkRemoved, ChunkStored, TierEvent
from kvstore.keys import BlockKey, Tier
from tests.support.net import free_port

vllm_kv_events = pytest.importorskip("vllm.distributed.kv_events")


def key(i: int) -> BlockKey:
    return BlockKey(bytes([i]) * 32)


EVENTS: list[list[TierEvent]] = [
    [
        ChunkStored(
            Tier.CPU,
            (key(1), key(2)),
            4,
            1.0,
            parent_key=key(9),
            token_ids=tuple(range(8)),
        ),
        ChunkStored(Tier.DISK, (key(1),), 4, 1.0),
    ],
    [ChunkRemoved(Tier.CPU, (key(1),), 2.0)],
    [ChunkRemoved(Tier.DISK, (key(1), key(2)), 3.0, reason="deleted")],
]


async def subscribe(ctx: zmq.asyncio.Context, endpoint: str) -> zmq.asyncio.Socket:
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(endpoint)
    return sub


async def publish_until_received(bus: EventBus, sub: zmq.asyncio.Socket) -> list[list[bytes]]:
    """Probe until the subscription is live (PUB drops before it), then publish EVENTS."""
    while not await sub.poll(50):
        bus.publish([ChunkStored(Tier.CPU, (key(0),), 4, 0.0)])
    frames = [await sub.recv_multipart()]
    while await sub.poll(200):
        frames.append(await sub.recv_multipart())
    probes = len(frames)
    for batch in EVENTS:  # one at a time: the bus merges queued batches into one write
        bus.publish(batch)
        frames.append(await asyncio.wait_for(sub.recv_multipart(), 5))
    return frames[probes:]


@pytest.mark.parametrize("int_hashes", [False, True], ids=["bytes", "int64"])
@pytest.mark.parametrize("transport", ["tcp", "ipc"])
async def test_a_stock_vllm_subscriber_decodes_our_stream(
    int_hashes: bool, transport: str, tmp_path: object
) -> None:
    if transport == "tcp":
        port = free_port()
        endpoint, connect = f"tcp://*:{port}", f"tcp://127.0.0.1:{port}"
    else:
        endpoint = connect = f"ipc://{tmp_path}/events.sock"
    sink = ZMQPublisherSink(endpoint, topic=b"kv-events", int_block_hashes=int_hashes, dp_rank=0)
    bus = EventBus([sink])
    await bus.start()
    ctx = zmq.asyncio.Context()
    sub = await subscribe(ctx, connect)
    try:
        frames = await publish_until_received(bus, sub)
    finally:
        sub.close(linger=0)
        ctx.term()
        assert await bus.close() == []

    decoder = msgspec.msgpack.Decoder(vllm_kv_events.KVEventBatch)
    seqs = [int.from_bytes(f[1], "big") for f in frames]
    assert seqs == list(range(seqs[0], seqs[0] + 3))
    assert all(f[0] == b"kv-events" for f in frames)
    batches = [decoder.decode(f[2]) for f in frames]
    assert all(b.data_parallel_rank == 0 for b in batches)

    def wire(k: bytes) -> bytes | int:
        return block_hash_to_wire(k, int_hashes=int_hashes)

    first = batches[0].events
    assert [type(e).__name__ for e in first] == ["BlockStored", "BlockStored"]
    assert first[0].block_hashes == [wire(key(1)), wire(key(2))]
    assert first[0].parent_block_hash == wire(key(9))
    assert first[0].token_ids == list(range(8))
    assert first[0].block_size == 4
    assert (first[0].medium, first[1].medium) == ("CPU", "STORAGE")
    assert first[1].parent_block_hash is None and first[1].token_ids == []
    removed = [batches[1].events[0], batches[2].events[0]]
    assert all(isinstance(e, vllm_kv_events.BlockRemoved) for e in removed)
    assert [e.medium for e in removed] == ["CPU", "STORAGE"]
    assert removed[1].block_hashes == [wire(key(1)), wire(key(2))]
    if int_hashes:
        assert first[0].block_hashes[0] == int.from_bytes(key(1)[-8:], "big")


async def test_replay_returns_buffered_batches_then_the_end_marker(tmp_path: object) -> None:
    sink = ZMQPublisherSink(
        f"ipc://{tmp_path}/pub.sock",
        replay_endpoint=f"ipc://{tmp_path}/replay.sock",
        int_block_hashes=False,
        buffer_steps=2,
    )
    bus = EventBus([sink])
    await bus.start()
    for i, batch in enumerate(EVENTS):  # nobody listens: only the replay buffer has them
        bus.publish(batch)
        while sink.next_seq <= i:
            await asyncio.sleep(0.01)
    ctx = zmq.asyncio.Context()
    dealer = ctx.socket(zmq.DEALER)
    dealer.connect(f"ipc://{tmp_path}/replay.sock")
    try:
        await dealer.send_multipart((b"", (0).to_bytes(8, "big")))
        replies = []
        while True:
            frames = await asyncio.wait_for(dealer.recv_multipart(), 5)
            if frames[2] == END_SEQ:
                break
            replies.append(frames)
    finally:
        dealer.close(linger=0)
        ctx.term()
        await bus.close()
    # buffer_steps=2 keeps the last two batches
    assert [int.from_bytes(f[2], "big") for f in replies] == [1, 2]
    assert all(f[0] == b"" and f[1] == b"kv-events" for f in replies)
    decoded = [decode_batch(f[3]) for f in replies]
    assert decoded[1].events[0].block_hashes == [key(1), key(2)]  # type: ignore[union-attr]
    assert decoded[0].data_parallel_rank is None


def test_endpoint_rules_follow_vllm() -> None:
    assert ZMQPublisherSink("tcp://*:5557", dp_rank=2).endpoint == "tcp://*:5559"
    assert ZMQPublisherSink("tcp://*:0", dp_rank=2).endpoint == "tcp://*:0"
    assert ZMQPublisherSink("inproc://ev", dp_rank=1).endpoint == "inproc://ev_dp1"
    assert ZMQPublisherSink("tcp://h:5557", dp_rank=0).endpoint == "tcp://h:5557"
