"""A circuit breaker: stop calling a server that keeps failing, probe it again after a backoff.

    CLOSED ──(N consecutive failures, or trip())──▶ OPEN ──(backoff elapsed)──▶ HALF_OPEN
       ▲                                              ▲                             │
       └────────────────(probe succeeds)──────────────┼──────(probe fails)──────────┘
                                                       backoff doubles, up to a cap

While OPEN every `allow()` is False at once (a miss, no waiting). In HALF_OPEN exactly one call,
the probe, is allowed; the others are refused until it reports. Every state change is reported to
the `on_change` callback (for the breaker state gauge); the log gets one warning when it opens and
one info line when it closes again (probes in between log at debug).

Not thread-safe: one event loop owns it.
"""

from __future__ import annotations

import enum
import logging
import time
from collections.abc import Callable

__all__ = ["BreakerState", "CircuitBreaker"]

logger = logging.getLogger(__name__)


class BreakerState(enum.IntEnum):
    """Gauge values: 0 closed (serving), 1 half-open (probing), 2 open (down)."""

    CLOSED = 0
    HALF_OPEN = 1
    OPEN = 2


class CircuitBreaker:
    """Consecutive-failure breaker with exponential backoff; the clock is injected."""

    def __init__(
        self,
        name: str,
        *,
        failure_threshold: int = 3,
        backoff_s: float = 1.0,
        backoff_max_s: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
        on_change: Callable[[str, BreakerState], None] | None = None,
    ) -> None:
        if failure_threshold < 1:
            raise ValueError(f"failure_threshold must be >= 1, got {failure_threshold}")
        if not 0 < backoff_s <= backoff_max_s:
            raise ValueError(f"need 0 < backoff_s ({backoff_s}) <= backoff_max_s ({backoff_max_s})")
        self.name = name
        self._threshold = failure_threshold
        self._backoff_min_s = backoff_s
        self._backoff_max_s = backoff_max_s
        self._clock = clock
        self._on_change = on_change
        self._state = BreakerState.CLOSED
        self._num_failures = 0
        self._backoff_s = backoff_s
        self._retry_at = 0.0
        self._probing = False

    @property
    def state(self) -> BreakerState:
        """The state now (an OPEN breaker whose backoff elapsed reads HALF_OPEN)."""
        if self._state is BreakerState.OPEN and self._clock() >= self._retry_at:
            return BreakerState.HALF_OPEN
        return self._state

    @property
    def retry_in_s(self) -> float:
        """Seconds until the next probe is allowed (0 unless OPEN)."""
        if self._state is not BreakerState.OPEN:
            return 0.0
        return max(0.0, self._retry_at - self._clock())

    def allow(self) -> bool:
        """May a call go out now? In HALF_OPEN the caller that gets True is the probe and must
        report `record_success()` or `record_failure()`."""
        if self._state is BreakerState.CLOSED:
            return True
        if self._state is BreakerState.OPEN:
            if self._clock() < self._retry_at:
                return False
            self._set(BreakerState.HALF_OPEN, "probing")
        if self._probing:
            return False
        self._probing = True
        return True

    def record_success(self) -> None:
        self._num_failures = 0
        self._probing = False
        self._backoff_s = self._backoff_min_s
        if self._state is not BreakerState.CLOSED:
            self._set(BreakerState.CLOSED, "a call succeeded")

    def record_failure(self, reason: str = "") -> None:
        self._num_failures += 1
        if self._state is BreakerState.HALF_OPEN:
            self._probing = False
            self._backoff_s = min(self._backoff_s * 2, self._backoff_max_s)
            self._open(f"the probe failed: {reason}" if reason else "the probe failed")
        elif self._state is BreakerState.CLOSED and self._num_failures >= self._threshold:
            self._backoff_s = self._backoff_min_s
            self._open(f"{self._num_failures} consecutive failures, last: {reason}")

    def abandon(self) -> None:
        """The call that `allow()` let through was cancelled before it could tell: no verdict,
        but let the next call probe."""
        self._probing = False

    def trip(self, reason: str) -> None:
        """Open now (e.g. the server was unreachable at start), whatever the count."""
        self._num_failures = max(self._num_failures, self._threshold)
        if self._state is BreakerState.HALF_OPEN:
            self.record_failure(reason)
        elif self._state is BreakerState.CLOSED:
            self._backoff_s = self._backoff_min_s
            self._open(reason)

    def _open(self, reason: str) -> None:
        self._retry_at = self._clock() + self._backoff_s
        self._set(BreakerState.OPEN, f"{reason}; retrying in {self._backoff_s:.3g} s")

    def _set(self, state: BreakerState, why: str) -> None:
        if state is self._state:
            return
        previous, self._state = self._state, state
        # One line when the server goes down and one when it is back; the probes in between
        # (every backoff, for as long as it is down) log at debug.
        if previous is BreakerState.CLOSED:
            level = logging.WARNING
        elif state is BreakerState.CLOSED:
            level = logging.INFO
        else:
            level = logging.DEBUG
        logger.log(level, "remote %s: circuit breaker %s (%s)", self.name, state.name, why)
        if self._on_change is not None:
            self._on_change(self.name, state)
