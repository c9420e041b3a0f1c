"""A ZMQ PUB stream of events in vLLM's KV-events wire format, with vLLM's replay socket.

Behaves like vLLM's `ZmqEventPublisher` so the same subscribers work: frames
`(topic, seq: 8-byte big-endian, msgpack KVEventBatch)`; an endpoint with `*`, `::`, `ipc://` or
`inproc://` is bound, any other is connected to; the port is offset by the DP rank; the optional
ROUTER replay socket answers a request carrying a start sequence number with every buffered
batch from there, then an end marker `(b"", END_SEQ, b"")`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Sequence

import zmq
import zmq.asyncio

from kvstore.errors import ConfigError
from kvstore.eventbus.wire import END_SEQ, encode_batch, int_block_hashes_from_env, to_wire_events
from kvstore.events import TierEvent

__all__ = ["ZMQPublisherSink", "is_bind_endpoint", "offset_endpoint_port"]

logger = logging.getLogger(__name__)

_PUB_LINGER_MS = 500  # let queued messages reach subscribers at close


def is_bind_endpoint(endpoint: str) -> bool:
    """vLLM's rule: bind wildcard and ipc/inproc endpoints; connect to the rest."""
    return "*" in endpoint or "::" in endpoint or endpoint.startswith(("ipc://", "inproc://"))


def offset_endpoint_port(endpoint: str, dp_rank: int | None) -> str:
    """vLLM's rule: tcp ports are offset by the DP rank (port 0 stays 0); inproc gets a suffix."""
    if not dp_rank:
        return endpoint
    if endpoint.startswith("inproc://"):
        return f"{endpoint}_dp{dp_rank}"
    if endpoint.startswith("tcp://"):
        base, _, port = endpoint.rpartition(":")
        return endpoint if int(port) == 0 else f"{base}:{int(port) + dp_rank}"
    return endpoint


class ZMQPublisherSink:
    """Publishes each written batch as one `KVEventBatch` with the next sequence number.

    `int_block_hashes`: publish hashes as 64-bit ints like vLLM with
    `VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1` (vLLM 0.32's default), or as the hash bytes;
    None follows that variable. `buffer_steps` batches are kept for replay.
    """

    def __init__(
        self,
        endpoint: str,
        *,
        topic: bytes = b"kv-events",
        replay_endpoint: str | None = None,
        dp_rank: int | None = None,
        buffer_steps: int = 10_000,
        hwm: int = 100_000,
        int_block_hashes: bool | None = None,
        name: str = "zmq",
    ) -> None:
        self._name = name
        self.endpoint = offset_endpoint_port(endpoint, dp_rank)
        self.replay_endpoint = (
            None if replay_endpoint is None else offset_endpoint_port(replay_endpoint, dp_rank)
        )
        self.topic = topic
        self.dp_rank = dp_rank
        self.int_block_hashes = (
            int_block_hashes_from_env() if int_block_hashes is None else int_block_hashes
        )
        self._hwm = hwm
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=buffer_steps)
        self._next_seq = 0
        self._ctx: zmq.asyncio.Context | None = None
        self._pub: zmq.asyncio.Socket | None = None
        self._replay: zmq.asyncio.Socket | None = None
        self._replay_task: asyncio.Task[None] | None = None

    @property
    def name(self) -> str:
        return self._name

    @property
    def next_seq(self) -> int:
        return self._next_seq

    async def start(self) -> None:
        """Open the sockets (and start the replay task). An endpoint that cannot be bound or
        connected (in use, malformed) raises ConfigError naming the KVStoreConfig key it comes
        from (`events_endpoint`, `events_replay_endpoint`), with nothing left open."""
        self._ctx = zmq.asyncio.Context()
        self._pub = self._ctx.socket(zmq.PUB)
        self._pub.set_hwm(self._hwm)
        try:
            if is_bind_endpoint(self.endpoint):
                self.endpoint = _bind(self._pub, self.endpoint, "events_endpoint")
            else:
                _connect(self._pub, self.endpoint, "events_endpoint")
            if self.replay_endpoint is not None:
                self._replay = self._ctx.socket(zmq.ROUTER)
                self.replay_endpoint = _bind(
                    self._replay, self.replay_endpoint, "events_replay_endpoint"
                )
        except ConfigError:
            await self.close()
            raise
        if self._replay is not None:
            is_running = asyncio.Event()
            self._replay_task = asyncio.create_task(
                self._serve_replay(self._replay, is_running), name=f"{self._name}-replay"
            )
            await is_running.wait()
        logger.info("publishing KV events on %s (replay: %s)", self.endpoint, self.replay_endpoint)

    async def write(self, batch: Sequence[TierEvent]) -> None:
        if self._pub is None:
            raise RuntimeError(f"ZMQ sink {self.endpoint} is not started")
        events = list(to_wire_events(batch, int_hashes=self.int_block_hashes))
        payload = encode_batch(events, ts=time.time(), dp_rank=self.dp_rank)
        seq = self._next_seq
        self._next_seq += 1
        await self._pub.send_multipart((self.topic, seq.to_bytes(8, "big"), payload))
        self._buffer.append((seq, payload))

    async def close(self) -> None:
        """(1) stop the replay task, (2) close the sockets, (3) end the context off-loop."""
        if self._replay_task is not None:
            self._replay_task.cancel()
            await asyncio.gather(self._replay_task, return_exceptions=True)
            self._replay_task = None
        if self._replay is not None:
            self._replay.close(linger=0)
            self._replay = None
        if self._pub is not None:
            self._pub.close(linger=_PUB_LINGER_MS)
            self._pub = None
        if self._ctx is not None:
            ctx, self._ctx = self._ctx, None
            await asyncio.to_thread(ctx.term)

    async def _serve_replay(self, sock: zmq.asyncio.Socket, is_running: asyncio.Event) -> None:
        is_running.set()
        while True:
            frames = await sock.recv_multipart()
            if len(frames) != 3:
                logger.warning("ignoring a replay request of %d frames (want 3)", len(frames))
                continue
            client_id, _, start_seq_bytes = frames
            start_seq = int.from_bytes(start_seq_bytes, "big")
            for seq, payload in list(self._buffer):
                if seq >= start_seq:
                    await sock.send_multipart(
                        (client_id, b"", self.topic, seq.to_bytes(8, "big"), payload)
                    )
            await sock.send_multipart((client_id, b"", b"", END_SEQ, b""))


def _bind(sock: zmq.asyncio.Socket, endpoint: str, key: str) -> str:
    """Bind `sock`; returns the bound endpoint (the real port for port 0)."""
    try:
        sock.bind(endpoint)
    except zmq.ZMQError as exc:
        raise ConfigError(f"{key}: cannot bind {endpoint!r}: {exc.strerror}") from exc
    return str(sock.getsockopt_string(zmq.LAST_ENDPOINT))


def _connect(sock: zmq.asyncio.Socket, endpoint: str, key: str) -> None:
    try:
        sock.connect(endpoint)
    except zmq.ZMQError as exc:
        raise ConfigError(f"{key}: cannot connect to {endpoint!r}: {exc.strerror}") from exc
