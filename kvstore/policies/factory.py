"""Build a policy by name."""

from __future__ import annotations

from collections.abc import Callable

from kvstore.errors import ConfigError
from kvstore.policies.arc import ARCPolicy
from kvstore.policies.base import EvictionPolicy
from kvstore.policies.lru import LRUPolicy

__all__ = ["POLICY_NAMES", "make_policy"]

_POLICIES: dict[str, Callable[[int], EvictionPolicy]] = {
    "lru": LRUPolicy,
    "arc": ARCPolicy,
}

POLICY_NAMES: tuple[str, ...] = tuple(_POLICIES)
"""The names `make_policy` accepts."""


def make_policy(name: str, capacity: int) -> EvictionPolicy:
    """A new, empty policy; `capacity` is the tier's size in keys (ARC bounds its ghosts by it)."""
    factory = _POLICIES.get(name)
    if factory is None:
        allowed = ", ".join(repr(known) for known in POLICY_NAMES)
        raise ConfigError(f"unknown eviction policy {name!r}; allowed: {allowed}")
    if capacity < 1:
        raise ConfigError(f"eviction policy capacity must be >= 1 key, got {capacity}")
    return factory(capacity)
