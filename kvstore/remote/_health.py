"""Node health: which errors count against a node, its circuit breaker, the round-trip tally.

Errors are mapped here, where redis-py's exceptions meet kvstore's: a refused, reset, hung or
CLUSTERDOWN node is a node failure (its breaker counts it); a command error (OOM under
`noeviction`, a wrong type) is that command's failure only.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from redis import exceptions as rexc

from kvstore.remote.breaker import BreakerState, CircuitBreaker
from kvstore.remote.config import RemoteConfig
from kvstore.remote.errors import RemoteAuthError
from kvstore.remote.stats import RemoteObserver, RemoteStats

__all__ = ["NODE_DOWN", "NodeHealth", "auth_error", "describe", "node_failure"]

NODE_DOWN = (
    rexc.ConnectionError,  # refused, reset, busy loading, max connections
    rexc.TimeoutError,
    TimeoutError,
    OSError,
    rexc.ClusterDownError,  # CLUSTERDOWN, MASTERDOWN
    rexc.TryAgainError,
    rexc.RedisClusterException,  # no reachable startup node, slot not covered
)
"""Errors that say the node, not the command, is unwell: they count against its breaker."""


def describe(exc: BaseException) -> str:
    """An error in one short line (redis-py's messages hold addresses, never passwords)."""
    text = str(exc) or type(exc).__name__
    return f"{type(exc).__name__}: {text}"[:200]


def auth_error(config: RemoteConfig, exc: BaseException) -> RemoteAuthError:
    """Refused credentials, as an error naming the key (and the variable), never the value."""
    where = config.endpoint.display()
    if config.password_env is None:
        hint = (
            "the server requires a password: set remote_password_env to the name of an "
            "environment variable holding it"
        )
    else:
        hint = f"the password in ${config.password_env} was refused"
    return RemoteAuthError(f"remote_password_env: {where}: {hint} ({describe(exc)})")


def node_failure(config: RemoteConfig, exc: BaseException) -> str | None:
    """Why `exc` counts against its node's breaker, in one line; None when it does not (a
    cancellation, or a bug: not the node's verdict)."""
    if isinstance(exc, rexc.AuthenticationError):  # a ConnectionError: checked first
        return describe(auth_error(config, exc))
    if isinstance(exc, NODE_DOWN):
        return describe(exc)
    return None


class NodeHealth:
    """One circuit breaker per node (created on first use) and the tally of round trips.

    The seed breaker paces (re)connecting; for a standalone server it is also the node's
    breaker, so one server has one state.
    """

    def __init__(
        self,
        config: RemoteConfig,
        *,
        observer: RemoteObserver | None,
        clock: Callable[[], float],
    ) -> None:
        self._config = config
        self._observer = observer
        self._clock = clock
        self._breakers: dict[str, CircuitBreaker] = {}
        self.stats = RemoteStats()
        self.seed_name = ",".join(config.endpoint.addresses)
        self.seed = self._make(self.seed_name)

    def _make(self, name: str) -> CircuitBreaker:
        return CircuitBreaker(
            name,
            failure_threshold=self._config.breaker_failures,
            backoff_s=self._config.breaker_backoff_s,
            backoff_max_s=self._config.breaker_backoff_max_s,
            clock=self._clock,
            on_change=self._changed,
        )

    def breaker(self, node: str) -> CircuitBreaker:
        if node == self.seed_name:
            return self.seed
        breaker = self._breakers.get(node)
        if breaker is None:
            breaker = self._breakers[node] = self._make(node)
        return breaker

    def states(self, nodes: Sequence[str]) -> dict[str, BreakerState]:
        return {node: self.breaker(node).state for node in nodes}

    def _changed(self, node: str, state: BreakerState) -> None:
        self.stats.breaker_changed(node, state)
        if self._observer is not None:
            self._observer.breaker_changed(node, state)

    def observe(
        self, op: str, node: str, num_keys: int, num_bytes: int, started: float, ok: bool
    ) -> None:
        """One round trip that began at `started` (time.perf_counter)."""
        self.record(op, node, num_keys, num_bytes, time.perf_counter() - started, ok)

    def record(
        self, op: str, node: str, num_keys: int, num_bytes: int, duration_s: float, ok: bool
    ) -> None:
        """One round trip that took `duration_s`."""
        self.stats.round_trip(op, node, num_keys, num_bytes, duration_s, ok)
        if self._observer is not None:
            self._observer.round_trip(op, node, num_keys, num_bytes, duration_s, ok)

    def report_rejected(self, kind: str) -> None:
        self.stats.value_rejected(kind)
        if self._observer is not None:
            self._observer.value_rejected(kind)
