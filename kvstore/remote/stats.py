"""What the remote tier reports for metrics: round trips, bytes, latency, breaker states, rejected
values. `RemoteObserver` is the plug point (a Prometheus adapter maps it onto `tier="remote"`
metrics); `RemoteStats` is the in-process tally every `RemoteStore` keeps.

Labels stay bounded: `op` is one of OPS, `node` is a server address (one per cluster master),
`kind` is one of REJECT_KINDS. Never a key.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Protocol

from kvstore.remote.breaker import BreakerState

__all__ = ["OPS", "REJECT_KINDS", "RemoteObserver", "RemoteStats"]

OPS = ("exists", "get", "touch", "put", "delete", "scan", "descriptor", "connect")
REJECT_KINDS = ("corrupt", "format", "version")


class RemoteObserver(Protocol):
    """Receives every round trip and state change; called on the store's event loop, must not
    block."""

    def round_trip(
        self, op: str, node: str, num_keys: int, num_bytes: int, duration_s: float, ok: bool
    ) -> None:
        """One pipeline (or command) to one node: `num_keys` keys, `num_bytes` value bytes
        moved (read for get, written for put), `ok` False on a connection error or timeout."""

    def breaker_changed(self, node: str, state: BreakerState) -> None:
        """A node's circuit breaker changed state."""

    def value_rejected(self, kind: str) -> None:
        """A stored value failed verification (`kind` in REJECT_KINDS): a miss."""


@dataclass
class RemoteStats:
    """Running totals (a `RemoteObserver`). Read them; do not mutate them."""

    num_round_trips: Counter[str] = field(default_factory=Counter)  # by op
    num_round_trips_by_node: Counter[str] = field(default_factory=Counter)
    num_failures: Counter[str] = field(default_factory=Counter)  # by op
    num_keys: Counter[str] = field(default_factory=Counter)  # by op
    num_bytes: Counter[str] = field(default_factory=Counter)  # by op
    duration_s: dict[str, float] = field(default_factory=dict)  # by op, summed
    max_duration_s: float = 0.0
    num_rejected: Counter[str] = field(default_factory=Counter)  # by kind
    breaker_states: dict[str, BreakerState] = field(default_factory=dict)

    def round_trip(
        self, op: str, node: str, num_keys: int, num_bytes: int, duration_s: float, ok: bool
    ) -> None:
        self.num_round_trips[op] += 1
        self.num_round_trips_by_node[node] += 1
        self.num_keys[op] += num_keys
        self.num_bytes[op] += num_bytes
        self.duration_s[op] = self.duration_s.get(op, 0.0) + duration_s
        self.max_duration_s = max(self.max_duration_s, duration_s)
        if not ok:
            self.num_failures[op] += 1

    def breaker_changed(self, node: str, state: BreakerState) -> None:
        self.breaker_states[node] = state

    def value_rejected(self, kind: str) -> None:
        self.num_rejected[kind] += 1

    @property
    def total_round_trips(self) -> int:
        return sum(self.num_round_trips.values())
