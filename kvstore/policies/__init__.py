"""Eviction policies: small classes behind one protocol with an atomic `evict(n, protected)`."""

from __future__ import annotations

from kvstore.policies.arc import ARCPolicy
from kvstore.policies.base import EvictionPolicy
from kvstore.policies.factory import POLICY_NAMES, make_policy
from kvstore.policies.lru import LRUPolicy

__all__ = ["ARCPolicy", "EvictionPolicy", "LRUPolicy", "POLICY_NAMES", "make_policy"]
