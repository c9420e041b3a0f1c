"""`Link`: the store's connection to the deployment, (re)opened under the seed breaker.

`connect` opens it once at start (an unreachable server is a warning and an open seed breaker,
refused credentials an error); later, every call that finds it closed reopens it when the seed
breaker allows (`ensure_backend`), within the call's deadline (`backend_by`).
"""

from __future__ import annotations

import asyncio
import logging
import time

from redis import exceptions as rexc

from kvstore.remote._backends import Backend, open_backend
from kvstore.remote._health import NODE_DOWN, NodeHealth, auth_error, describe
from kvstore.remote.config import RemoteConfig
from kvstore.remote.errors import RemoteConfigError

__all__ = ["Link"]

logger = logging.getLogger(__name__)


class Link:
    """The backend once open; owned by the store's event loop."""

    def __init__(self, config: RemoteConfig, health: NodeHealth) -> None:
        self._config = config
        self._health = health
        self._seed = health.seed
        self._seed_name = health.seed_name
        self._timeout_s = config.timeout_s
        self._open_lock = asyncio.Lock()
        self.backend: Backend | None = None
        self._is_closed = False

    async def connect(self) -> bool:
        """See `RemoteStore.connect`."""
        if self.backend is not None:
            return True
        if self._is_closed:
            return False
        started = time.perf_counter()
        try:
            async with asyncio.timeout(self._timeout_s), self._open_lock:
                if self.backend is None:
                    self.backend = await open_backend(self._config)
        except rexc.AuthenticationError as exc:
            raise auth_error(self._config, exc) from None
        except NODE_DOWN as exc:
            self._health.observe("connect", self._seed_name, 0, 0, started, False)
            self._seed.trip(f"unreachable at start: {describe(exc)}")
            logger.warning(
                "remote tier %s unreachable at start (%s); serving from the local tiers, "
                "retrying in %.3g s",
                self._config.endpoint.display(),
                describe(exc),
                self._seed.retry_in_s,
            )
            return False
        self._health.observe("connect", self._seed_name, 0, 0, started, True)
        self._seed.record_success()
        logger.info(
            "remote tier %s connected (%s)",
            self._config.endpoint.display(),
            "cluster" if self.backend.is_cluster else "standalone",
        )
        return True

    async def ensure_backend(self) -> Backend | None:
        """The backend, connecting now if allowed (the seed breaker paces reconnects)."""
        if self.backend is not None or self._is_closed:
            return self.backend
        if not self._seed.allow():
            return None
        started = time.perf_counter()
        try:
            async with self._open_lock:
                if self.backend is None:
                    self.backend = await open_backend(self._config)
        except (rexc.AuthenticationError, RemoteConfigError) as exc:
            auth = isinstance(exc, rexc.AuthenticationError)
            logger.error(
                "remote tier: reconnecting failed: %s",
                auth_error(self._config, exc) if auth else exc,
            )
            self._seed.record_failure(type(exc).__name__)
            return None
        except NODE_DOWN as exc:
            self._health.observe("connect", self._seed_name, 0, 0, started, False)
            self._seed.record_failure(describe(exc))
            return None
        except BaseException:
            self._seed.abandon()
            raise
        self._health.observe("connect", self._seed_name, 0, 0, started, True)
        self._seed.record_success()
        return self.backend

    async def backend_by(self, deadline: float) -> Backend | None:
        """`ensure_backend` by `deadline` (the loop's clock); None past it."""
        try:
            async with asyncio.timeout_at(deadline):
                return await self.ensure_backend()
        except TimeoutError:
            self._seed.record_failure(f"no answer within {self._timeout_s * 1000:.0f} ms")
            return None

    async def close(self) -> None:
        """Close the connections; never reopened."""
        self._is_closed = True
        backend, self.backend = self.backend, None
        if backend is not None:
            await backend.aclose()
