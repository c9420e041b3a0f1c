"""Helpers for driving KVStoreConnector inside a real in-process engine (tests, demo)."""

from __future__ import annotations

from typing import Any

from kvstore.vllm.engine import drain, scheduler_connector

__all__ = ["drain", "kvstore_summary"]


def kvstore_summary(llm: Any) -> dict[str, Any]:
    runtime = scheduler_connector(llm).runtime
    assert runtime is not None
    summary: dict[str, Any] = runtime.summary()
    return summary
