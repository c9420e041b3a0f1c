"""LMDBTier never blocks vLLM's scheduler thread: copies run on its threads, behind a gate here."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from vllm.v1.kv_offload.base import LookupResult, ReqContext

from kvstore.errors import KVStoreError
from kvstore.vllm import LMDBTier

from .helpers import Harness, fill, finish, job, key

CTX = ReqContext(req_id="lookup")
QUICK_S = 0.25  # far more than a non-blocking call takes, far less than the gate holds


class Gate:
    """Holds every call of a store method until `open()` (or the test ends)."""

    def __init__(self) -> None:
        self.event = threading.Event()
        self.entered = threading.Event()

    def wrap(self, method: Callable[..., Any]) -> Callable[..., Any]:
        def gated(*args: Any, **kwargs: Any) -> Any:
            self.entered.set()
            assert self.event.wait(30), "the gate was never opened"
            return method(*args, **kwargs)

        return gated

    def open(self) -> None:
        self.event.set()


@pytest.fixture
def gate() -> Iterator[Gate]:
    gate = Gate()
    yield gate
    gate.open()


def timed(call: Callable[[], object]) -> float:
    start_s = time.perf_counter()
    call()
    return time.perf_counter() - start_s


def test_submit_store_returns_before_the_write(
    harness: Harness, gate: Gate, monkeypatch: pytest.MonkeyPatch
) -> None:
    tier = harness.open()
    monkeypatch.setattr(tier.store, "put_many", gate.wrap(tier.store.put_many))
    fill(harness.primary, 0, seed=1)
    assert timed(lambda: tier.submit_store(job(1, [key(0)], [0]))) < QUICK_S
    assert gate.entered.wait(5)
    assert tier.has_pending_work()
    assert timed(lambda: list(tier.get_finished_jobs())) < QUICK_S
    assert tier.lookup(key(0), CTX) is LookupResult.MISS  # not readable before it is written
    gate.open()
    assert finish(tier, 1)[1].success
    assert tier.lookup(key(0), CTX) is LookupResult.HIT
    assert not tier.has_pending_work()


def test_submit_load_returns_before_the_read(
    harness: Harness, gate: Gate, monkeypatch: pytest.MonkeyPatch
) -> None:
    tier = harness.open()
    values = harness.store(tier, 1, 0, 1)
    monkeypatch.setattr(tier.store, "get_many_into", gate.wrap(tier.store.get_many_into))
    assert timed(lambda: tier.submit_load(job(2, [key(0)], [9], is_promotion=True))) < QUICK_S
    assert gate.entered.wait(5)
    assert tier.has_pending_work() and list(tier.get_finished_jobs()) == []
    gate.open()
    assert finish(tier, 2)[2].success
    assert harness.primary[9].tobytes() == values[key(0)]


def test_drain_jobs_waits_for_the_copies(
    harness: Harness, gate: Gate, monkeypatch: pytest.MonkeyPatch
) -> None:
    tier = harness.open()
    monkeypatch.setattr(tier.store, "put_many", gate.wrap(tier.store.put_many))
    tier.submit_store(job(1, [key(0)], [0]))
    assert gate.entered.wait(5)
    threading.Timer(0.2, gate.open).start()
    assert timed(tier.drain_jobs) >= 0.1
    assert [r.job_id for r in tier.get_finished_jobs()] == [1]


def test_drain_jobs_past_its_deadline_says_so_and_waits_on(
    harness: Harness, gate: Gate, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    tier = harness.open(shutdown_timeout_s=0.1)
    monkeypatch.setattr(tier.store, "put_many", gate.wrap(tier.store.put_many))
    tier.submit_store(job(1, [key(0)], [0]))
    assert gate.entered.wait(5)
    threading.Timer(0.5, gate.open).start()
    with caplog.at_level(logging.WARNING, logger="kvstore.vllm.lmdb_tier.tier"):
        assert timed(tier.drain_jobs) >= 0.4  # vLLM must not reuse the slot mid-copy
    assert "still running" in caplog.text
    assert [r.job_id for r in tier.get_finished_jobs()] == [1]


def test_shutdown_with_a_copy_stuck_past_its_deadline_raises(
    harness: Harness, gate: Gate, monkeypatch: pytest.MonkeyPatch
) -> None:
    tier: LMDBTier = harness.open(shutdown_timeout_s=0.2)
    monkeypatch.setattr(tier.store, "put_many", gate.wrap(tier.store.put_many))
    tier.submit_store(job(1, [key(0)], [0]))
    assert gate.entered.wait(5)
    with pytest.raises(KVStoreError, match="still running"):  # vLLM then keeps the region
        tier.shutdown()
    gate.open()
    tier.shutdown()  # the copy finished: this one closes the store
    assert [r.job_id for r in tier.get_finished_jobs()] == [1]
