"""Helpers for driving KVStoreConnector inside a real in-process engine (tests, demo)."""

from __future__ import annotations

import time
from typing import Any

from kvstore.vllm.engine import scheduler_connector

__all__ = ["drain", "kvstore_summary"]


def drain(llm: Any, timeout_s: float = 30.0) -> None:
    """Step the engine until kvstore has no transfer, promotion or disk write in flight."""
    connector = scheduler_connector(llm)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        runtime = connector.runtime
        service = runtime.service if runtime is not None else None
        busy = connector.scheduler.has_pending_work() or (
            service is not None and (service.num_queued_chunks or service.num_inflight_promotions)
        )
        if not busy:
            connector.scheduler.settle()
            return
        llm.llm_engine.step()
        time.sleep(0.005)
    raise TimeoutError(f"kvstore still busy after {timeout_s}s")


def kvstore_summary(llm: Any) -> dict[str, Any]:
    runtime = scheduler_connector(llm).runtime
    assert runtime is not None
    summary: dict[str, Any] = runtime.summary()
    return summary
