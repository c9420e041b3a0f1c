"""Network helpers for tests and local tools."""

from __future__ import annotations

from kvstore.ports import free_port

__all__ = ["free_port"]
