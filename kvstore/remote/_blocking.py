"""Bulk GETs on blocking sockets, in a few worker threads.

redis-py's asyncio client reads a large value through `asyncio.StreamReader`: the transport's
recv, a copy into the reader's buffer, a copy out of it per read, hiredis's own buffer, then the
value. Its blocking client reads the socket straight into hiredis. Measured on loopback (Redis
7, hiredis, 63 values of 512 KiB, idle 2-vCPU Xeon with AVX-512/AMX): sequential GETs took 26 ms
with the asyncio client and 11-13 ms with the blocking one; in a process that also runs a vLLM
engine, every one of the asyncio path's ~250 socket reads per prompt is an event-loop turn that
needs the GIL, while a blocking recv releases it.

So `get_many` calls that know their values are large (`BLOCKING_MIN_BYTES`) read them here
(`BlockingReads.read`):
per node, pipelines of at most `READ_PIPELINE_BYTES`, on a blocking client to that node, in a
worker thread; a read of more than two pipelines is cut in `STRIPES` parts read at once on
their own connections (the same 63 values, verified and copied into rows: 17.2 ms on one
connection, 14.0-14.3 ms on two, 14.8-15.0 ms on three). Each node's call runs under the
store's deadline and that node's breaker (`NodeHealth`), and its stats are one round trip per
pipeline, as on the asyncio path; a thread that outlives the deadline stops before its next
pipeline, and its socket timeout bounds the one in flight.

The pipelines go out on kvstore's own RESP connections (`kvstore.remote._resp`), kept idle per
node between reads (one the server closed meanwhile is replaced before use): each value lands
in a buffer the thread reuses and is consumed from there before the next arrives, instead of
becoming a new bytes object first. TLS endpoints read on redis-py's blocking client as before.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, NamedTuple

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from kvstore.remote._backends import (
    DOWN,
    UNASSIGNED,
    Backend,
    NodeAddress,
    client_kwargs,
    split_by_bytes,
)
from kvstore.remote._health import NodeHealth, node_failure
from kvstore.remote._resp import RespConnection
from kvstore.remote.config import RemoteConfig

__all__ = ["BLOCKING_MIN_BYTES", "READ_PIPELINE_BYTES", "BlockingReads", "Consume", "RoundTrip"]

BLOCKING_MIN_BYTES = 64 << 10
"""Values at least this large are read on blocking sockets (KV chunks are hundreds of KiB)."""

Consume = Callable[[int, bytes | memoryview], Any]
"""What a read does with each value it finds: (its index in the keys, the value) -> result. A
memoryview is only valid during the call (its buffer takes the next value)."""

_MAX_THREADS = 4  # reads at once; more queue

STRIPES = 2
"""A node's share of a read larger than two pipelines goes out on this many connections at
once, each a worker thread (the socket waits without the GIL)."""

READ_PIPELINE_BYTES = 2 << 20
"""The most value bytes one read pipeline asks for (`pipeline_bytes` when smaller). Redis
queues a pipeline's replies and sends them as the socket drains; past the socket's send buffer
it stalls. Loopback, Redis 7, 512 KiB values, Linux's default `tcp_wmem` (max 4 MiB), 63
values per read, interleaved runs: pipelines of 1-4 values took 9.3-12.8 ms, of 6 values 18-19
ms, of 7-8 values 22-25 ms."""


class BlockingReads:
    """Blocking clients, one per node (each with its own connection pool), and the threads
    that use them. Thread-safe; `close` once, from the owner."""

    def __init__(self, config: RemoteConfig, health: NodeHealth) -> None:
        self._config = config
        self._health = health
        self._clients: dict[str, redis.Redis] = {}  # TLS endpoints: redis-py's blocking client
        self._idle: dict[str, list[RespConnection]] = {}
        self._conns: set[RespConnection] = set()  # every open one, idle or reading
        self._scratch = threading.local()  # each worker thread's value buffer
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(_MAX_THREADS, thread_name_prefix="kvstore-redis-r")
        self._is_closed = False

    async def read(
        self,
        backend: Backend,
        keys: Sequence[bytes],
        value_bytes: int,
        consume: Consume,
        deadline: float,
    ) -> list[Any]:
        """Per key: its result (as `get`), or DOWN where its node was unavailable; one call per
        node, the nodes at once, all by `deadline`."""
        out: list[Any] = [DOWN] * len(keys)

        async def run(node: str, indexes: list[int]) -> None:
            if node == UNASSIGNED:
                return
            results = await self._node_call(
                backend.address(node),
                [keys[i] for i in indexes],
                value_bytes,
                deadline,
                lambda i, value: consume(indexes[i], value),
            )
            for index, result in zip(indexes, results or (), strict=False):
                out[index] = result

        await asyncio.gather(*(run(node, idx) for node, idx in backend.group(keys).items()))
        return out

    async def _node_call(
        self,
        node: NodeAddress,
        keys: list[bytes],
        value_bytes: int,
        deadline: float,
        consume: Consume,
    ) -> list[Any] | None:
        """One node's share of `read`, under its breaker; None when the node is down (breaker
        open, a failure, no answer by `deadline`)."""
        health = self._health
        breaker = health.breaker(node.name)
        if not breaker.allow():
            return None
        started = time.perf_counter()
        try:
            async with asyncio.timeout_at(deadline):
                results, trips = await self.get(node, keys, value_bytes, deadline, consume)
        except RuntimeError:  # the store closed under the read: its keys are misses
            breaker.abandon()
            return None
        except BaseException as exc:
            health.observe("get", node.name, len(keys), 0, started, False)
            failure: str | None = node_failure(self._config, exc)
            if isinstance(exc, TimeoutError):  # the deadline (asyncio's, or the thread's own)
                failure = f"no answer within {self._config.timeout_s * 1000:.0f} ms"
            if failure is None:  # cancelled: not the node's verdict
                breaker.abandon()
                raise
            breaker.record_failure(failure)
            return None
        for trip in trips:
            health.record("get", node.name, *trip, True)
        breaker.record_success()
        return results

    async def get(
        self,
        node: NodeAddress,
        keys: Sequence[bytes],
        value_bytes: int,
        deadline: float,
        consume: Consume | None = None,
    ) -> tuple[list[Any], list[RoundTrip]]:
        """Each key's GET result (bytes, or what `consume(index, value)` returned for it;
        None for a missing key; the error the server answered for a key), in pipelines of at
        most `READ_PIPELINE_BYTES`, and each pipeline's round trip. `consume` runs on the worker
        thread as each pipeline arrives (so at most one pipeline of values is alive, not a
        whole prompt's, whose fresh pages cost more than the copy), and never once this call
        has returned or been cancelled. Raises what the node's failure raised (the caller's
        NODE_DOWN), RuntimeError once closed. `deadline` is on the loop's clock
        (`time.monotonic`)."""
        gate = _Gate(consume)
        loop = asyncio.get_running_loop()
        num = len(keys)
        num_stripes = max(1, min(STRIPES, num * value_bytes // READ_PIPELINE_BYTES))
        bounds = [num * i // num_stripes for i in range(num_stripes + 1)]
        try:
            parts = await asyncio.gather(*(
                loop.run_in_executor(
                    self._pool, self._get, node, list(keys[start:end]), value_bytes, deadline,
                    gate, start,
                )
                for start, end in itertools.pairwise(bounds)
            ))  # fmt: skip
        finally:
            gate.close()  # cancelled or timed out: the thread may go on, but writes nothing
        results = [result for part, _ in parts for result in part]
        return results, [trip for _, trips in parts for trip in trips]

    def _get(
        self,
        node: NodeAddress,
        keys: list[bytes],
        value_bytes: int,
        deadline: float,
        gate: _Gate,
        offset: int,
    ) -> tuple[list[Any], list[RoundTrip]]:
        limit = min(self._config.pipeline_bytes, READ_PIPELINE_BYTES)
        parts = split_by_bytes(list(range(len(keys))), [value_bytes] * len(keys), limit)
        if self._config.endpoint.tls:  # redis-py's blocking client (RespConnection has no TLS)
            client = self._client(node)
            return _read_parts(keys, parts, deadline, gate, offset,
                               lambda wanted: _pipelined_gets(client, wanted))  # fmt: skip
        conn = self._connection(node)
        is_done = False
        try:
            scratch = self._scratch_for(value_bytes)
            got = _read_parts(keys, parts, deadline, gate, offset,
                              lambda wanted: conn.get_many(wanted, scratch))  # fmt: skip
            is_done = True
        finally:
            if not is_done:  # replies may be left unread: the stream is out of step
                conn.is_broken = True
            self._give_back(node, conn)
        return got

    def _scratch_for(self, value_bytes: int) -> bytearray:
        """This thread's buffer for one value (reused: no fresh pages per value)."""
        scratch: bytearray | None = getattr(self._scratch, "buffer", None)
        if scratch is None or len(scratch) < value_bytes:
            scratch = self._scratch.buffer = bytearray(value_bytes)
        return scratch

    def _connection(self, node: NodeAddress) -> RespConnection:
        with self._lock:
            if self._is_closed:
                raise RuntimeError("the remote store is closed")
            idle = self._idle.get(node.name, [])
            stale = []
            conn = None
            while idle and conn is None:
                conn = idle.pop()
                if conn.is_stale():
                    stale.append(conn)
                    self._conns.discard(conn)
                    conn = None
        for dead in stale:
            dead.close()
        if conn is not None:
            return conn
        config = self._config
        conn = RespConnection.open(
            host=node.host, port=node.port, unix_path=node.unix_path, timeout_s=config.timeout_s,
            username=config.endpoint.username, password=config.password(),
            db=config.endpoint.db,
        )  # fmt: skip
        with self._lock:
            if not self._is_closed:
                self._conns.add(conn)
                return conn
        conn.close()
        raise RuntimeError("the remote store is closed")

    def _give_back(self, node: NodeAddress, conn: RespConnection) -> None:
        """An idle connection again, or closed when a read broke it (or the reads closed)."""
        with self._lock:
            if not conn.is_broken and not self._is_closed:
                self._idle.setdefault(node.name, []).append(conn)
                return
            self._conns.discard(conn)
        conn.close()

    def _client(self, node: NodeAddress) -> redis.Redis:
        with self._lock:
            if self._is_closed:
                raise RuntimeError("the remote store is closed")
            client = self._clients.get(node.name)
            if client is None:
                client = self._clients[node.name] = _blocking_client(self._config, node)
            return client

    def close(self) -> None:
        """Close every connection; reads in flight fail, later ones raise RuntimeError."""
        with self._lock:
            self._is_closed = True
            clients, self._clients = list(self._clients.values()), {}
            conns, self._conns, self._idle = list(self._conns), set(), {}
        self._pool.shutdown(wait=False, cancel_futures=True)
        for client in clients:
            client.close()
        for conn in conns:  # a read blocked on one wakes and fails
            conn.close()


def _read_parts(
    keys: list[bytes],
    parts: Sequence[Sequence[int]],
    deadline: float,
    gate: _Gate,
    offset: int,
    pipeline: Callable[[list[bytes]], Iterable[Any]],
) -> tuple[list[Any], list[RoundTrip]]:
    """Each part's GETs as one `pipeline` call, its values consumed in order as they come
    (a memoryview value is valid only until the next), and each part's round trip."""
    results: list[Any] = []
    trips: list[RoundTrip] = []
    for part in parts:
        if time.monotonic() >= deadline:  # the caller gave up on us
            raise TimeoutError("remote read past its deadline")
        started = time.perf_counter()
        num_bytes = 0
        replies = pipeline([keys[index] for index in part])
        for index, reply in zip(part, replies, strict=True):
            if isinstance(reply, bytes | memoryview):
                num_bytes += len(reply)
                results.append(gate.consume(offset + index, reply))
            else:  # None (missing) or the error the server answered
                results.append(reply)
        trips.append(RoundTrip(len(part), num_bytes, time.perf_counter() - started))
    return results, trips


def _pipelined_gets(client: redis.Redis, keys: list[bytes]) -> list[Any]:
    with client.pipeline(transaction=False) as pipe:
        for key in keys:
            pipe.get(key)
        return list(pipe.execute(raise_on_error=False))


class RoundTrip(NamedTuple):
    """One pipeline: keys asked, value bytes answered, seconds from send to last reply (each
    value consumed as it arrived, before the next)."""

    num_keys: int
    num_bytes: int
    duration_s: float


class _Gate:
    """`consume`, until `close`: after `close` returns, no call is running or will run (the
    caller may then hand the buffers `consume` writes to someone else)."""

    def __init__(self, consume: Consume | None) -> None:
        self._consume = consume
        self._lock = threading.Lock()
        self._is_open = True

    def consume(self, index: int, value: bytes | memoryview) -> Any:
        if self._consume is None:
            return bytes(value)  # a view's buffer takes the next value
        with self._lock:
            return self._consume(index, value) if self._is_open else None

    def close(self) -> None:
        with self._lock:
            self._is_open = False


def _blocking_client(config: RemoteConfig, node: NodeAddress) -> redis.Redis:
    kwargs = client_kwargs(config, socket_timeout_s=config.timeout_s)
    kwargs["retry"] = Retry(NoBackoff(), 0)  # the blocking client's own Retry class
    if node.unix_path is not None:
        return redis.Redis(unix_socket_path=node.unix_path, db=config.endpoint.db, **kwargs)
    return redis.Redis(host=node.host or "", port=node.port or 0, db=config.endpoint.db, **kwargs)
