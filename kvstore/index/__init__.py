"""The tier index: which chunk is in which tier, with pins, states and eviction.

Pure bookkeeping, no I/O: the connector asks it what to copy where, the tier service does the
copies and reports back through the `complete_*` calls. See `TierIndex` for the threading contract.
"""

from __future__ import annotations

from kvstore.index.config import WRITE_POLICIES, IndexConfig
from kvstore.index.errors import IndexStateError, InvariantError
from kvstore.index.event_log import EventLog
from kvstore.index.plans import (
    IndexStats,
    LoadPlan,
    LookupResult,
    PromotionPlan,
    SeedEntry,
    StorePlan,
    TierStats,
    WritePlan,
)
from kvstore.index.table import EntryState
from kvstore.index.tier_index import TierIndex

__all__ = [
    "EntryState",
    "EventLog",
    "IndexConfig",
    "IndexStateError",
    "IndexStats",
    "InvariantError",
    "LoadPlan",
    "LookupResult",
    "PromotionPlan",
    "SeedEntry",
    "StorePlan",
    "TierIndex",
    "TierStats",
    "WRITE_POLICIES",
    "WritePlan",
]
