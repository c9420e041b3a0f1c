"""Strict, bounded access to a Redis server or Redis Cluster for the store commands.

The engine's `RemoteStore` turns a failing node into misses (its data path never raises); a
command line tool must say the server is down instead, or `verify` would report a dead node's
chunks as vanished and `ls` would print a partial listing as if it were whole. So this reuses the
remote tier's connection layer (`kvstore.remote._backends`: cluster detection, keys grouped by
the master serving their slot, one pipeline per node, no retries) with the opposite policy:
every round trip ends within the timeout, and any node failure raises `RemoteUnavailableError`
naming the URL and the node. Messages never hold a password (redis-py's name addresses only).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Sequence
from typing import Any, TypeVar

from redis import exceptions as rexc

from kvstore.remote import RemoteAuthError, RemoteConfig, RemoteError, RemoteUnavailableError
from kvstore.remote._backends import UNASSIGNED, Backend, open_backend
from kvstore.remote._health import NODE_DOWN, describe

__all__ = ["Command", "RedisAdmin"]

T = TypeVar("T")

Command = tuple[str, ...]
"""A command without its key, e.g. `("MEMORY", "USAGE")`: the key is appended."""


class RedisAdmin:
    """One connection set to the server or cluster `config` names (asyncio; one loop)."""

    def __init__(self, config: RemoteConfig) -> None:
        self._config = config
        self.display = config.endpoint.display()
        self._backend: Backend | None = None

    @property
    def backend(self) -> Backend:
        if self._backend is None:
            raise RemoteError(f"{self.display}: not connected")
        return self._backend

    async def open(self) -> None:
        """Connect and detect cluster mode within the timeout."""
        self._backend = await self._bounded("connecting", open_backend(self._config))

    async def close(self) -> None:
        backend, self._backend = self._backend, None
        if backend is not None:
            async with asyncio.timeout(self._config.timeout_s):
                await backend.aclose()

    def _auth_error(self, exc: BaseException) -> RemoteAuthError:
        if self._config.password_env is None:
            hint = "the server wants a password: name the variable holding it in --password-env"
        else:
            hint = f"the server refused the password in ${self._config.password_env}"
        return RemoteAuthError(f"{self.display}: {hint} ({type(exc).__name__})")

    def _failure(self, what: str, exc: BaseException) -> RemoteError:
        if isinstance(exc, rexc.AuthenticationError | rexc.AuthenticationWrongNumberOfArgsError):
            return self._auth_error(exc)
        if isinstance(exc, TimeoutError | rexc.TimeoutError):
            timeout_ms = self._config.timeout_ms
            return RemoteUnavailableError(
                f"{self.display}: no answer within {timeout_ms} ms ({what}); raise --timeout-ms "
                "if the server is only slow"
            )
        if isinstance(exc, NODE_DOWN):
            return RemoteUnavailableError(f"cannot reach {self.display} ({what}): {describe(exc)}")
        return RemoteError(f"{self.display}: {what}: {describe(exc)}")

    async def _bounded(self, what: str, awaitable: Awaitable[T]) -> T:
        try:
            async with asyncio.timeout(self._config.timeout_s):
                return await awaitable
        except (*NODE_DOWN, rexc.ResponseError) as exc:
            raise self._failure(what, exc) from None

    async def scan(self, match: bytes) -> list[bytes]:
        """Every key matching `match`: SCAN (never KEYS) on every master, one page a round trip."""
        backend = self.backend
        found: list[bytes] = []
        for master in backend.masters():
            client = backend.node_client(master.name)
            cursor: int = 0
            while True:
                cursor, page = await self._bounded(
                    f"SCAN on {master.name}",
                    client.scan(cursor, match=match, count=self._config.scan_count),
                )
                found.extend(key if isinstance(key, bytes) else key.encode() for key in page)
                if int(cursor) == 0:
                    break
        return found

    async def per_key(self, keys: Sequence[bytes], *commands: Command) -> list[list[Any]]:
        """Run each of `commands` on each key: per key, the replies in order. One pipeline per
        node, the nodes at once; a reply that is a command error (e.g. OBJECT IDLETIME under an
        LFU policy) is returned as the exception, a node that fails raises."""
        out: list[list[Any]] = [[] for _ in keys]
        groups = self.backend.group(keys)
        what = f"{' '.join(commands[0])} of {len(keys)} keys"
        runs = asyncio.gather(
            *(
                self._node_pipeline(node, indexes, keys, commands, out)
                for node, indexes in groups.items()
            ),
            return_exceptions=True,
        )
        for outcome in await self._bounded(what, runs):
            if isinstance(outcome, RemoteError):
                raise outcome
            if isinstance(outcome, BaseException):
                raise self._failure(what, outcome) from None
        return out

    async def _node_pipeline(
        self,
        node: str,
        indexes: list[int],
        keys: Sequence[bytes],
        commands: Sequence[Command],
        out: list[list[Any]],
    ) -> None:
        """One node's share of `per_key`: its replies go to `out` at their keys' indexes."""
        if node == UNASSIGNED:
            raise RemoteUnavailableError(
                f"{self.display}: no master serves the slot of {keys[indexes[0]]!r}"
            )
        pipe = self.backend.pipeline(node)
        for index in indexes:
            for command in commands:
                pipe.execute_command(*command, keys[index])
        replies = await pipe.execute(raise_on_error=False)
        for reply in replies:
            if isinstance(reply, NODE_DOWN):
                raise self._failure(f"node {node}", reply)
        width = len(commands)
        for position, index in enumerate(indexes):
            out[index] = list(replies[position * width : (position + 1) * width])

    async def info(self, section: str) -> list[dict[str, Any]]:
        """`INFO section` of every master (an empty dict where the command is refused)."""
        backend = self.backend
        replies: list[dict[str, Any]] = []
        for master in backend.masters():
            client = backend.node_client(master.name)
            try:
                async with asyncio.timeout(self._config.timeout_s):
                    replies.append(await client.info(section))
            except rexc.AuthenticationError as exc:
                raise self._failure(f"INFO on {master.name}", exc) from None
            except rexc.ResponseError:  # INFO renamed or forbidden (some managed services)
                replies.append({})
            except NODE_DOWN as exc:
                raise self._failure(f"INFO on {master.name}", exc) from None
        return replies
