"""What a lookup answers and what the pipeline keeps per requester (a vLLM request)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from kvstore.keys import BlockKey, Tier

__all__ = ["PENDING", "LookupAnswer", "OwnerState", "num_leading"]


@dataclass(frozen=True, slots=True)
class LookupAnswer:
    """`is_pending`: ask again later (chunks are being promoted). Otherwise the first
    `len(tiers)` keys are ready in CPU now; `tiers[i]` is where chunk i was found."""

    tiers: tuple[Tier, ...] = ()
    is_pending: bool = False

    @property
    def num_hits(self) -> int:
        return len(self.tiers)


PENDING = LookupAnswer(is_pending=True)


@dataclass(slots=True)
class OwnerState:
    """One requester's promotion state (a vLLM request)."""

    promoting: set[BlockKey] = field(default_factory=set)  # promotions in flight
    held: set[BlockKey] = field(default_factory=set)  # holds to release at load or abandon
    sources: dict[BlockKey, Tier] = field(default_factory=dict)  # promoted from a lower tier
    is_lookup_recorded: bool = False
    deadline_s: float | None = None  # the most it waits on its promotions (the cost model's)
    has_given_up: bool = False  # waited past the deadline: no more disk or remote for it


def num_leading(tiers: Sequence[Tier], tier: Tier) -> int:
    """How many of `tiers` lead with `tier`."""
    count = 0
    for found in tiers:
        if found is not tier:
            break
        count += 1
    return count
