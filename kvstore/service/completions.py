"""Results the tier service hands back to the index's owner (vLLM's scheduler thread).

The service never touches the index: it posts these, and the scheduler thread applies them at
its next entry, so the index stays single-threaded.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kvstore.keys import BlockKey

__all__ = ["Completion", "PromotionDone", "WriteDone"]


@dataclass(frozen=True, slots=True)
class WriteDone:
    """A write-through batch finished: `ok` keys are on disk, `failed` are not."""

    ok: tuple[BlockKey, ...]
    failed: tuple[BlockKey, ...] = ()


@dataclass(frozen=True, slots=True)
class PromotionDone:
    """Disk -> CPU reads finished. `corrupt` and `missing` keys are gone from disk."""

    ok: tuple[BlockKey, ...]
    failed: tuple[BlockKey, ...] = ()
    corrupt: tuple[BlockKey, ...] = field(default=())
    missing: tuple[BlockKey, ...] = field(default=())


Completion = WriteDone | PromotionDone
