"""Redis's own removals of a namespace's chunks (maxmemory evictions, expiries, DEL/UNLINK by
anyone), delivered as chunk keys, so the remote tier can emit one `BlockRemoved` per removal.

Redis publishes them as keyevent notifications (`__keyevent@<db>__:evicted|expired|del`, the
payload is the key) when `notify-keyspace-events` holds `E` plus `e`, `x` and `g`. The watcher
adds the missing flags with CONFIG SET (keeping the others) and warns once per node if that is
refused (a managed Redis: set the parameter there). In a cluster notifications are node-local, so
it subscribes on every master, and follows the masters the store sees.

Pub/sub is at-most-once: while a subscription is down, removals are lost. After a
re-subscription the sink's `resubscribed(node)` is called so the owner can reconcile (for
instance with `RemoteChunks.lookup` of what it believes is remote). FLUSHDB/FLUSHALL publish no
per-key events at all.

Ownership: `start()` starts one supervisor task and one listener task per master; `close()` stops
them (an Event and cancellation) and their connections close on the way out. A listener that
dies logs why.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Sequence
from typing import Any, Protocol

from redis import exceptions as rexc
from redis.asyncio import Redis

from kvstore.keys import BlockKey
from kvstore.remote import codec
from kvstore.remote._backends import NodeAddress, node_client
from kvstore.remote.client import RemoteStore
from kvstore.tasks import OwnedTasks

__all__ = ["EVENTS", "REQUIRED_FLAGS", "RemovalSink", "RemovalWatcher"]

logger = logging.getLogger(__name__)

EVENTS = ("evicted", "expired", "del")
REQUIRED_FLAGS = "Egxe"  # keyevent channel; generic (del), expired, evicted
_ALL_FLAGS_ALIAS = "A"  # "g$lshzxetd"
_MAX_BATCH = 512
_CONNECTION_ERRORS = (
    rexc.ConnectionError,
    rexc.TimeoutError,
    TimeoutError,
    OSError,
)


class RemovalSink(Protocol):
    """Receives removals; called on the watcher's event loop, must not block."""

    def removed(self, keys: Sequence[BlockKey]) -> None:
        """These chunks are gone from the remote tier (each key once per removal)."""

    def resubscribed(self, node: str) -> None:
        """`node`'s subscription was re-established after a gap: removals may have been
        missed meanwhile."""


def missing_flags(current: str) -> str:
    """The flags of REQUIRED_FLAGS that `current` (a notify-keyspace-events value) lacks."""
    missing = ""
    for flag in REQUIRED_FLAGS:
        covered = flag in current or (flag in "gxe" and _ALL_FLAGS_ALIAS in current)
        if not covered:
            missing += flag
    return missing


class _Listener:
    """One master's subscription, reconnecting with backoff until stopped."""

    def __init__(self, watcher: RemovalWatcher, node: NodeAddress) -> None:
        self.watcher = watcher
        self.node = node
        self.subscribed = asyncio.Event()
        self._has_subscribed_before = False
        self._has_warned_config = False
        self._is_down_logged = False
        self.task = watcher.tasks.spawn(self._run(), name=node.name, on_death=self._died)

    def _died(self, exc: BaseException) -> None:
        logger.error("remote removals from %s are no longer reported", self.node.name)

    async def _run(self) -> None:
        config = self.watcher.store.config
        backoff_s = config.subscribe_backoff_s
        stop = self.watcher.stop_event
        while not stop.is_set():
            # Reads wait for events indefinitely; the ping below detects a hung server.
            client = node_client(config, self.node, socket_timeout=None)
            try:
                await self._listen(client)
            except _CONNECTION_ERRORS as exc:
                if not self._is_down_logged:
                    logger.warning(
                        "remote removals: subscription to %s lost (%s); retrying",
                        self.node.name,
                        exc,
                    )
                    self._is_down_logged = True
            finally:
                self.subscribed.clear()
                await client.aclose()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), backoff_s)
            backoff_s = min(backoff_s * 2, config.subscribe_backoff_max_s)

    async def _listen(self, client: Redis) -> None:
        config = self.watcher.store.config
        channels = [f"__keyevent@{config.endpoint.db}__:{event}" for event in EVENTS]
        async with client.pubsub() as pubsub:
            async with asyncio.timeout(config.timeout_s):
                await self._enable_notifications(client)
                await pubsub.subscribe(*channels)
                confirmed = 0
                while confirmed < len(channels):
                    message = await pubsub.get_message(timeout=config.timeout_s)
                    if message is not None and message["type"] == "subscribe":
                        confirmed += 1
            self.subscribed.set()
            if self._has_subscribed_before:
                logger.info("remote removals: resubscribed to %s", self.node.name)
                self.watcher.sink.resubscribed(self.node.name)
            self._has_subscribed_before = True
            self._is_down_logged = False
            await self._receive(pubsub)

    async def _enable_notifications(self, client: Redis) -> None:
        try:
            current = str(
                (await client.config_get("notify-keyspace-events")).get(
                    "notify-keyspace-events", ""
                )
            )
            missing = missing_flags(current)
            if missing:
                await client.config_set("notify-keyspace-events", current + missing)
        except rexc.ResponseError as exc:  # CONFIG disabled, renamed or not permitted
            if not self._has_warned_config:
                logger.warning(
                    "remote removals: cannot set notify-keyspace-events on %s (%s); unless the "
                    "server already publishes keyevents %s, remote removals go unreported",
                    self.node.name,
                    exc,
                    REQUIRED_FLAGS,
                )
                self._has_warned_config = True

    async def _receive(self, pubsub: Any) -> None:
        """Deliver removal batches; ping when idle and give up on a server that stops
        answering (a hung server keeps the socket open)."""
        config = self.watcher.store.config
        loop = asyncio.get_running_loop()
        ping_every_s = self.watcher.ping_interval_s
        last_heard = loop.time()
        ping_sent_at: float | None = None
        while not self.watcher.stop_event.is_set():
            message = await pubsub.get_message(timeout=min(1.0, ping_every_s))
            now = loop.time()
            if message is not None:
                last_heard, ping_sent_at = now, None
                batch = [message]
                while len(batch) < _MAX_BATCH:
                    more = await pubsub.get_message(timeout=0)
                    if more is None:
                        break
                    batch.append(more)
                self.watcher.deliver(batch)
            elif ping_sent_at is not None and now - ping_sent_at > config.timeout_s:
                raise TimeoutError(f"no answer to PING within {config.timeout_ms} ms")
            elif ping_sent_at is None and now - last_heard > ping_every_s:
                await pubsub.ping()
                ping_sent_at = now


class RemovalWatcher:
    """Subscribes to removals on every master of `store` and feeds one namespace's chunk keys
    to `sink`."""

    def __init__(
        self,
        store: RemoteStore,
        namespace_id: str,
        sink: RemovalSink,
        *,
        ping_interval_s: float = 5.0,
        refresh_interval_s: float = 5.0,
    ) -> None:
        codec.namespace_pattern(namespace_id)  # validates the id
        self.store = store
        self.namespace_id = namespace_id
        self.sink = sink
        self.ping_interval_s = ping_interval_s
        self.refresh_interval_s = refresh_interval_s
        self.stop_event = asyncio.Event()
        self.num_removed = 0
        self._listeners: dict[str, _Listener] = {}
        self.tasks = OwnedTasks("remote-removals")
        self._supervisor: asyncio.Task[None] | None = None
        self._followed = asyncio.Event()

    @property
    def subscribed_nodes(self) -> list[str]:
        return sorted(name for name, lis in self._listeners.items() if lis.subscribed.is_set())

    async def start(self, timeout_s: float | None = None) -> bool:
        """Start watching; True once every master is subscribed, False if that did not happen
        within `timeout_s` (default: the store's timeout). It keeps trying either way."""
        if self._supervisor is None:
            self._supervisor = self.tasks.spawn(self._supervise(), name="supervisor")
        wait_s = self.store.config.timeout_s if timeout_s is None else timeout_s
        try:
            async with asyncio.timeout(wait_s):
                await self._followed.wait()
                await asyncio.gather(*(lis.subscribed.wait() for lis in self._listeners.values()))
        except TimeoutError:
            return False
        return bool(self._listeners)

    async def _supervise(self) -> None:
        while not self.stop_event.is_set():
            await self.store.ensure_connected()
            self._follow({m.name: m for m in self.store.masters()})
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stop_event.wait(), self.refresh_interval_s)

    def _follow(self, masters: dict[str, NodeAddress]) -> None:
        for name in set(self._listeners) - set(masters):
            task = self._listeners.pop(name).task
            if task is not None:
                task.cancel()
        for name, node in masters.items():
            if name not in self._listeners:
                self._listeners[name] = _Listener(self, node)
        if masters:
            self._followed.set()

    def deliver(self, messages: Sequence[dict[str, Any]]) -> None:
        keys: list[BlockKey] = []
        for message in messages:
            if message.get("type") != "message" or not isinstance(message.get("data"), bytes):
                continue
            key = codec.parse_chunk_key(self.namespace_id, message["data"])
            if key is not None:
                keys.append(key)
        if keys:
            self.num_removed += len(keys)
            try:
                self.sink.removed(keys)
            except Exception:  # the sink's bug must not end the subscription
                logger.exception("remote removals: the sink failed on %d keys", len(keys))

    async def close(self, timeout_s: float = 5.0) -> None:
        """Stop the supervisor and every listener (they only wait on sockets: cancelling is the
        quick way out), closing their connections."""
        self.stop_event.set()
        self._listeners.clear()
        await self.tasks.close(time.monotonic() + timeout_s)

    async def __aenter__(self) -> RemovalWatcher:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()
