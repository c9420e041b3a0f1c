"""The circuit breaker's state machine, on an injected clock."""

from __future__ import annotations

import logging

import pytest

from kvstore.remote import BreakerState, CircuitBreaker


class Clock:
    def __init__(self) -> None:
        self.now_s = 100.0

    def __call__(self) -> float:
        return self.now_s


def make(clock: Clock, changes: list[tuple[str, BreakerState]]) -> CircuitBreaker:
    return CircuitBreaker(
        "node",
        failure_threshold=3,
        backoff_s=1.0,
        backoff_max_s=4.0,
        clock=clock,
        on_change=lambda name, state: changes.append((name, state)),
    )


def test_opens_after_consecutive_failures_only() -> None:
    clock, changes = Clock(), []
    breaker = make(clock, changes)
    breaker.record_failure("a")
    breaker.record_failure("b")
    breaker.record_success()  # resets the count
    breaker.record_failure("c")
    breaker.record_failure("d")
    assert breaker.state is BreakerState.CLOSED and breaker.allow()
    breaker.record_failure("e")
    assert breaker.state is BreakerState.OPEN
    assert not breaker.allow()
    assert changes == [("node", BreakerState.OPEN)]
    assert breaker.retry_in_s == pytest.approx(1.0)


def test_half_open_lets_one_probe_through() -> None:
    clock, changes = Clock(), []
    breaker = make(clock, changes)
    breaker.trip("unreachable at start")
    assert not breaker.allow()
    clock.now_s += 1.0
    assert breaker.state is BreakerState.HALF_OPEN
    assert breaker.allow()  # the probe
    assert not breaker.allow()  # everyone else waits for its verdict
    breaker.record_success()
    assert breaker.state is BreakerState.CLOSED and breaker.allow()
    assert [s for _, s in changes] == [
        BreakerState.OPEN,
        BreakerState.HALF_OPEN,
        BreakerState.CLOSED,
    ]


def test_backoff_doubles_up_to_the_cap_and_resets_on_success() -> None:
    clock, changes = Clock(), []
    breaker = make(clock, changes)
    breaker.trip("down")
    waits = []
    for _ in range(4):
        waits.append(breaker.retry_in_s)
        clock.now_s += breaker.retry_in_s
        assert breaker.allow()
        breaker.record_failure("still down")
    assert waits == [1.0, 2.0, 4.0, 4.0]
    clock.now_s += breaker.retry_in_s
    assert breaker.allow()
    breaker.record_success()
    breaker.trip("down again")
    assert breaker.retry_in_s == 1.0


def test_an_abandoned_probe_lets_the_next_call_probe() -> None:
    clock, changes = Clock(), []
    breaker = make(clock, changes)
    breaker.trip("down")
    clock.now_s += 1.0
    assert breaker.allow()
    breaker.abandon()
    assert breaker.allow()


def test_one_log_line_when_it_opens_and_one_when_it_closes(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock, changes = Clock(), []
    breaker = make(clock, changes)
    with caplog.at_level(logging.INFO, logger="kvstore.remote.breaker"):
        for _ in range(5):
            breaker.record_failure("refused")
        for _ in range(3):  # probes that fail: debug only
            clock.now_s += breaker.retry_in_s
            breaker.allow()
            breaker.record_failure("refused")
        clock.now_s += breaker.retry_in_s
        breaker.allow()
        breaker.record_success()
    lines = [(r.levelno, r.getMessage()) for r in caplog.records]
    assert len(lines) == 2, lines
    assert lines[0][0] == logging.WARNING and "OPEN" in lines[0][1] and "refused" in lines[0][1]
    assert lines[1][0] == logging.INFO and "CLOSED" in lines[1][1]


def test_bad_tuning_is_refused() -> None:
    with pytest.raises(ValueError, match="failure_threshold"):
        CircuitBreaker("n", failure_threshold=0)
    with pytest.raises(ValueError, match="backoff"):
        CircuitBreaker("n", backoff_s=5.0, backoff_max_s=1.0)
