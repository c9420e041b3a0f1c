"""The remote tier's own metrics: round trips per operation, breaker states, rejected values.

`RemoteMetrics` is a `kvstore.remote.RemoteObserver` (called on the tier service's event loop);
per-tier series (hits, stored, removed, transfers) carry `tier="remote"` in the shared metrics.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from kvstore.metrics import names
from kvstore.metrics.labels import DURATION_BUCKETS_S

__all__ = ["BREAKER_STATES", "REMOTE_OPS", "RemoteMetrics"]

REMOTE_OPS: tuple[str, ...] = (
    "exists", "get", "touch", "put", "delete", "scan", "descriptor", "connect",
)  # fmt: skip
BREAKER_STATES: tuple[str, ...] = ("closed", "half_open", "open")  # BreakerState 0, 1, 2


class RemoteMetrics:
    """Registered on the engine's kvstore registry; label values initialised up front."""

    def __init__(self, registry: CollectorRegistry, on_rejected: Counter) -> None:
        self._round_trips = Histogram(
            names.REMOTE_ROUND_TRIP_SECONDS,
            "One pipeline to one remote node, by operation and result.",
            ["op", "result"],
            buckets=DURATION_BUCKETS_S,
            registry=registry,
        )
        for op in REMOTE_OPS:
            for result in ("ok", "error"):
                self._round_trips.labels(op, result)
        self._breakers = Gauge(
            names.REMOTE_BREAKER_NODES,
            "Remote nodes by circuit-breaker state: closed (serving), half_open (probing), "
            "open (down, calls fail fast).",
            ["state"],
            registry=registry,
        )
        for state in BREAKER_STATES:
            self._breakers.labels(state)
        self._states: dict[str, int] = {}
        self._rejected = on_rejected

    def round_trip(
        self, op: str, node: str, num_keys: int, num_bytes: int, duration_s: float, ok: bool
    ) -> None:
        self._round_trips.labels(op, "ok" if ok else "error").observe(duration_s)

    def breaker_changed(self, node: str, state: int) -> None:
        """`state` is a `kvstore.remote.BreakerState` (0 closed, 1 half-open, 2 open)."""
        self._states[node] = int(state)
        for value, name in enumerate(BREAKER_STATES):
            self._breakers.labels(name).set(sum(1 for s in self._states.values() if s == value))

    def value_rejected(self, kind: str) -> None:
        self._rejected.labels("remote").inc()
