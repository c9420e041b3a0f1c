"""`RemoteStore`: batched, bounded, breaker-guarded access to a Redis server or Redis Cluster.

Guarantees, for every call:
- It returns within `remote_timeout_ms` of being called (connecting included), whatever the
  server does: dead, hung (SIGSTOP), restarting, refusing connections.
- One round trip per node: the keys of a batch are grouped by the master that serves them and
  each group goes out as one pipeline; the groups run concurrently. Bulk values are the
  exception: puts (and gets told the value size) cut a node's group into pipelines of at most
  `pipeline_bytes` (4 MiB) that follow each other, because Redis serves one 64 MiB pipeline of
  4 MiB values 1.4x (GET) to 4x (SET) slower than the same values a few at a time (measured on
  loopback, redis 7.0, hiredis). Gets of values of `BLOCKING_MIN_BYTES` and more (KV chunks)
  run on blocking sockets in worker threads, in pipelines of at most 2 MiB
  (`kvstore.remote._blocking`), under the same deadline, breakers and stats.
- A node whose circuit breaker is open costs nothing: its keys are misses (`exists_many` False,
  `get_many` None, `put_many`/`delete_many` False) at once, no I/O. A dead master of a cluster
  costs only its own slots.
- The data path never raises for an unavailable server; the administrative calls (`scan_keys`,
  descriptors) raise `RemoteUnavailableError` so a CLI can say so.
- An unreachable server at `connect()` is a warning and an open breaker, not an exception; the
  store reconnects by itself after the backoff. Refused credentials raise `RemoteAuthError`
  naming `remote_password_env`, never the password.

Threading: one asyncio event loop (the tier service's) owns a store; it is not thread-safe.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

from redis import exceptions as rexc

from kvstore.remote._backends import (
    DOWN,
    UNASSIGNED,
    AnyPipeline,
    Backend,
    NodeAddress,
    split_by_bytes,
)
from kvstore.remote._blocking import BLOCKING_MIN_BYTES, BlockingReads, Consume
from kvstore.remote._health import NODE_DOWN, NodeHealth, describe, node_failure
from kvstore.remote._link import Link
from kvstore.remote.breaker import BreakerState
from kvstore.remote.codec import descriptor_key
from kvstore.remote.config import RemoteConfig
from kvstore.remote.errors import RemoteUnavailableError
from kvstore.remote.stats import RemoteObserver

__all__ = ["RemoteStore"]

logger = logging.getLogger(__name__)


def _keep(index: int, value: bytes | memoryview) -> bytes:
    return bytes(value)  # a view's buffer takes the next value


class RemoteStore:
    """Raw byte values under raw Redis keys (the codec and namespaces live in
    `RemoteChunks`); see the module docstring for what every call guarantees.

    Threading: owned by one asyncio event loop (the tier service's); NOT thread-safe. Other
    threads enter through `asyncio.run_coroutine_threadsafe`.
    """

    def __init__(
        self,
        config: RemoteConfig,
        *,
        observer: RemoteObserver | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self._health = NodeHealth(config, observer=observer, clock=clock)
        self.stats = self._health.stats
        self._seed = self._health.seed
        self._seed_name = self._health.seed_name
        self._breaker = self._health.breaker
        self._observe = self._health.observe
        self._timeout_s = config.timeout_s
        self._link = Link(config, self._health)
        self._blocking = BlockingReads(config, self._health)

    # -- state ---------------------------------------------------------------------------------

    @property
    def _backend(self) -> Backend | None:
        return self._link.backend

    @property
    def is_connected(self) -> bool:
        return self._backend is not None

    @property
    def is_cluster(self) -> bool | None:
        """Cluster mode as the server reported it; None until connected."""
        return None if self._backend is None else self._backend.is_cluster

    def breaker_states(self) -> dict[str, BreakerState]:
        """Each node's breaker (the seed address(es) until connected), for the gauge."""
        if self._backend is None:
            return {self._seed_name: self._seed.state}
        return self._health.states([m.name for m in self._backend.masters()])

    def masters(self) -> list[NodeAddress]:
        """The masters as last seen (empty until connected)."""
        return [] if self._backend is None else self._backend.masters()

    def report_rejected(self, kind: str) -> None:
        """Count a stored value that failed verification (`RemoteChunks` calls it)."""
        self._health.report_rejected(kind)

    # -- connecting ----------------------------------------------------------------------------

    def _deadline(self) -> float:
        return asyncio.get_running_loop().time() + self._timeout_s

    async def connect(self) -> bool:
        """Connect and detect cluster mode, within the timeout. False (a warning, the breaker
        open, retried later by the calls themselves) when the server is unreachable; raises
        `RemoteAuthError` for refused credentials, `RemoteConfigError` for a URL that does not
        match the server (a seed list pointing at a standalone server)."""
        return await self._link.connect()

    async def _backend_by(self, deadline: float) -> Backend | None:
        return await self._link.backend_by(deadline)

    async def ensure_connected(self) -> bool:
        """Connected, or connected now if the breaker allows a try (within the timeout)."""
        return await self._backend_by(self._deadline()) is not None

    # -- one pipeline per node -----------------------------------------------------------------

    async def _node_call(
        self,
        op: str,
        backend: Backend,
        node: str,
        build: Callable[[AnyPipeline], None],
        num_keys: int,
        measure: Callable[[list[Any]], int],
    ) -> list[Any] | None:
        """Run one node's pipeline; None when the node is down (breaker open or a failure)."""
        if node == UNASSIGNED:
            return None
        breaker = self._breaker(node)
        if not breaker.allow():
            return None
        started = time.perf_counter()
        try:
            pipe = backend.pipeline(node)
            build(pipe)
            results: list[Any] = await pipe.execute(raise_on_error=False)
        except BaseException as exc:
            failure = node_failure(self.config, exc)
            if failure is None:  # cancelled (our deadline or the caller): not the node's verdict
                self._observe(op, node, num_keys, 0, started, False)
                breaker.abandon()
                raise
        else:
            down = [r for r in results if isinstance(r, NODE_DOWN)]
            if not down or len(down) < len(results):
                self._observe(op, node, num_keys, measure(results), started, True)
                breaker.record_success()
                return results
            failure = describe(down[0])
        self._observe(op, node, num_keys, 0, started, False)
        breaker.record_failure(failure)
        return None

    async def _batched(
        self,
        op: str,
        keys: Sequence[bytes],
        build: Callable[[AnyPipeline, Sequence[int]], object],
        measure: Callable[[Sequence[int], list[Any]], int] = lambda indexes, results: 0,
        sizes: Sequence[int] | None = None,
    ) -> list[Any]:
        """Per key: its pipeline result, or DOWN where its node was unavailable.

        Each node's keys go out as one pipeline, or, when `sizes` (value bytes per key) add up
        to more than `pipeline_bytes`, as several that follow each other on that node. Nodes run
        concurrently; everything ends by one deadline.
        """
        out: list[Any] = [DOWN] * len(keys)
        if not keys:
            return out
        deadline = self._deadline()
        backend = await self._backend_by(deadline)
        if backend is None:
            return out
        groups = backend.group(keys)

        async def run(node: str, indexes: list[int]) -> None:
            for part in split_by_bytes(indexes, sizes, self.config.pipeline_bytes):
                results = await self._run_part(op, backend, node, part, build, measure, deadline)
                if results is None:
                    return  # the node failed: the rest of its keys stay DOWN
                for index, result in zip(part, results, strict=True):
                    out[index] = result

        await asyncio.gather(*(run(node, indexes) for node, indexes in groups.items()))
        return out

    async def _run_part(
        self,
        op: str,
        backend: Backend,
        node: str,
        indexes: Sequence[int],
        build: Callable[[AnyPipeline, Sequence[int]], object],
        measure: Callable[[Sequence[int], list[Any]], int],
        deadline: float,
    ) -> list[Any] | None:
        """One pipeline of `indexes` to `node`, by `deadline`; None if the node failed."""

        def build_group(pipe: AnyPipeline) -> None:
            build(pipe, indexes)

        def measure_group(results: list[Any]) -> int:
            return measure(indexes, results)

        try:
            async with asyncio.timeout_at(deadline):
                return await self._node_call(
                    op, backend, node, build_group, len(indexes), measure_group
                )
        except TimeoutError:
            breaker = self._breaker(node)
            breaker.record_failure(f"no answer within {self._timeout_s * 1000:.0f} ms")
            return None

    # -- the data path -------------------------------------------------------------------------

    async def exists_many(self, keys: Sequence[bytes]) -> list[bool]:
        """Which keys exist; False for keys of unavailable nodes."""
        found, _ = await self.exists_answered(keys)
        return found

    async def exists_answered(self, keys: Sequence[bytes]) -> tuple[list[bool], bool]:
        """`exists_many`, and whether every node answered (so the round trip's time is the
        link's, not a timeout's or an open breaker's)."""

        def build(pipe: AnyPipeline, indexes: Sequence[int]) -> None:
            for i in indexes:
                pipe.exists(keys[i])

        results = await self._batched("exists", keys, build)
        found = [isinstance(r, int) and r > 0 for r in results]
        return found, all(r is not DOWN for r in results)

    async def touch_many(self, keys: Sequence[bytes]) -> list[bool]:
        """TOUCH each key (updates its last access for the eviction policy); True where it
        exists, False for keys of unavailable nodes."""

        def build(pipe: AnyPipeline, indexes: Sequence[int]) -> None:
            for i in indexes:
                pipe.touch(keys[i])

        results = await self._batched("touch", keys, build)
        return [isinstance(r, int) and r > 0 for r in results]

    async def get_many(
        self, keys: Sequence[bytes], *, value_bytes: int | None = None
    ) -> list[bytes | None]:
        """Each key's value; None for a missing key or one of an unavailable node.
        `value_bytes`, the expected size of a value, lets large values go out in pipelines
        of at most `pipeline_bytes` (one round trip per node otherwise), and values of
        `BLOCKING_MIN_BYTES` or more be read on blocking sockets (`read_many`)."""
        return await self.read_many(keys, value_bytes=value_bytes)

    async def read_many(
        self,
        keys: Sequence[bytes],
        *,
        value_bytes: int | None = None,
        consume: Consume | None = None,
    ) -> list[Any]:
        """`get_many`, where each value found becomes what `consume(index, value)` returns
        (None stays None). Values of at least `BLOCKING_MIN_BYTES` are read on blocking
        sockets in worker threads (`kvstore.remote._blocking`), and `consume` then runs
        there, as each pipeline arrives, never after this call returned or was cancelled."""
        consume = consume or _keep

        if value_bytes is None or value_bytes < BLOCKING_MIN_BYTES:

            def build(pipe: AnyPipeline, indexes: Sequence[int]) -> None:
                for i in indexes:
                    pipe.get(keys[i])

            def measure(indexes: Sequence[int], results: list[Any]) -> int:
                return sum(len(r) for r in results if isinstance(r, bytes))

            sizes = None if value_bytes is None else [value_bytes] * len(keys)
            results = await self._batched("get", keys, build, measure, sizes)
            return [consume(i, r) if isinstance(r, bytes) else None for i, r in enumerate(results)]
        deadline = self._deadline()
        backend = await self._backend_by(deadline) if keys else None
        if backend is None:
            return [None] * len(keys)
        results = await self._blocking.read(backend, keys, value_bytes, consume, deadline)
        moved = [i for i, r in enumerate(results) if isinstance(r, rexc.ResponseError)]
        if moved and self.is_cluster:  # MOVED/ASK while a cluster reshards: its client follows
            again = await self.read_many(
                [keys[i] for i in moved], consume=lambda i, value: consume(moved[i], value)
            )
            for index, result in zip(moved, again, strict=True):
                results[index] = result
        return [None if r is DOWN or isinstance(r, rexc.RedisError) else r for r in results]

    async def put_many(self, items: Sequence[tuple[bytes, bytes]]) -> list[bool]:
        """SET each key to its value; True where the write landed. False for every item when
        `remote_write` is false. Pipelines hold at most `pipeline_bytes` of values (one per
        node when the batch is smaller)."""
        if not self.config.enable_write:
            return [False] * len(items)
        keys = [key for key, _ in items]

        def build(pipe: AnyPipeline, indexes: Sequence[int]) -> None:
            for i in indexes:
                pipe.set(items[i][0], items[i][1])

        def measure(indexes: Sequence[int], results: list[Any]) -> int:
            return sum(len(items[i][1]) for i, r in zip(indexes, results, strict=True) if r is True)

        sizes = [len(value) for _, value in items]
        results = await self._batched("put", keys, build, measure, sizes)
        for result in results:
            if isinstance(result, rexc.ResponseError):  # e.g. OOM under noeviction
                logger.debug("remote put refused: %s", describe(result))
        return [r is True for r in results]

    async def delete_many(self, keys: Sequence[bytes]) -> list[bool]:
        """DEL each key; True where a key was deleted (False: absent, or node unavailable).
        Not gated by `remote_write`: a read-only replica still deletes corrupt values."""

        def build(pipe: AnyPipeline, indexes: Sequence[int]) -> None:
            for i in indexes:
                pipe.delete(keys[i])

        results = await self._batched("delete", keys, build)
        return [isinstance(r, int) and r > 0 for r in results]

    # -- administrative ------------------------------------------------------------------------

    async def _one(self, op: str, key: bytes, build: Callable[[AnyPipeline], object]) -> Any:
        (result,) = await self._batched(op, [key], lambda pipe, _: build(pipe))
        if result is DOWN:
            raise RemoteUnavailableError(
                f"remote {self.config.endpoint.display()}: the node serving {key!r} is unavailable"
            )
        if isinstance(result, Exception):
            raise RemoteUnavailableError(f"remote {op} of {key!r}: {describe(result)}")
        return result

    async def put_descriptor(self, namespace_id: str, descriptor_json: bytes) -> bool:
        """Store a namespace's descriptor unless one is there (SET NX); True when written.
        Raises RemoteUnavailableError when the server cannot be reached."""
        if not self.config.enable_write:
            return False
        key = descriptor_key(namespace_id)
        result = await self._one("descriptor", key, lambda p: p.set(key, descriptor_json, nx=True))
        return result is True

    async def get_descriptor(self, namespace_id: str) -> bytes | None:
        """A namespace's descriptor (JSON bytes), None if absent. Raises
        RemoteUnavailableError when the server cannot be reached."""
        key = descriptor_key(namespace_id)
        result = await self._one("descriptor", key, lambda p: p.get(key))
        return result if isinstance(result, bytes) else None

    async def scan_keys(self, match: bytes, *, count: int | None = None) -> AsyncIterator[bytes]:
        """Every key matching `match`, with SCAN (never KEYS) on every master, one bounded
        round trip per SCAN page. Raises RemoteUnavailableError when a master is unavailable
        (a partial listing would look complete)."""
        backend = await self._backend_by(self._deadline())
        if backend is None:
            raise RemoteUnavailableError(f"remote {self.config.endpoint.display()} is unavailable")
        for master in backend.masters():
            async for key in self._scan_node(backend, master.name, match, count):
                yield key

    async def _scan_node(
        self, backend: Backend, node: str, match: bytes, count: int | None
    ) -> AsyncIterator[bytes]:
        client = backend.node_client(node)
        breaker = self._breaker(node)
        cursor = 0
        while True:
            if not breaker.allow():
                raise RemoteUnavailableError(f"remote node {node} is unavailable (breaker open)")
            started = time.perf_counter()
            try:
                async with asyncio.timeout(self._timeout_s):
                    cursor, keys = await client.scan(
                        cursor, match=match, count=count or self.config.scan_count
                    )
            except (*NODE_DOWN, rexc.ResponseError) as exc:
                self._observe("scan", node, 0, 0, started, False)
                breaker.record_failure(describe(exc))
                raise RemoteUnavailableError(
                    f"remote node {node}: SCAN failed: {describe(exc)}"
                ) from None
            except BaseException:
                breaker.abandon()
                raise
            self._observe("scan", node, len(keys), 0, started, True)
            breaker.record_success()
            for key in keys:
                yield key if isinstance(key, bytes) else key.encode()
            if int(cursor) == 0:
                return

    async def close(self) -> None:
        """Close every connection; later calls are misses (and administrative ones raise)."""
        self._blocking.close()
        await self._link.close()

    async def __aenter__(self) -> RemoteStore:
        await self.connect()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()
