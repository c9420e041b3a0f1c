"""The bounded label values kvstore's metrics use, and the histogram buckets.

Every label value is listed here so each series exists (at zero) from the first scrape. Keys,
request ids and paths are never label values.
"""

from __future__ import annotations

from enum import StrEnum

from kvstore.keys import Tier

__all__ = [
    "DURATION_BUCKETS_S",
    "Direction",
    "IOOp",
    "QueueName",
    "REMOVAL_REASONS",
    "AUDIT_RESULTS",
    "LOAD_DECISIONS",
    "LOAD_DECISION_TIERS",
    "DROP_REASONS",
    "SINK_NAMES",
    "SIZE_BUCKETS_BYTES",
    "TIERS",
    "TransferResult",
    "removal_reason",
]

TIERS: tuple[Tier, ...] = tuple(Tier)


class Direction(StrEnum):
    """Where a transfer moves bytes (the engine's KV cache is "engine")."""

    ENGINE_TO_CPU = "engine_to_cpu"
    CPU_TO_ENGINE = "cpu_to_engine"
    CPU_TO_DISK = "cpu_to_disk"
    DISK_TO_CPU = "disk_to_cpu"
    CPU_TO_REMOTE = "cpu_to_remote"
    REMOTE_TO_CPU = "remote_to_cpu"


class TransferResult(StrEnum):
    OK = "ok"
    ERROR = "error"


class QueueName(StrEnum):
    """The tier service's bounded work queues (event sinks are counted per sink instead)."""

    WRITE_THROUGH = "write_through"
    REMOTE_WRITE = "remote_write"
    PROMOTION = "promotion"
    EVICTION = "eviction"
    EVENTS = "events"


class IOOp(StrEnum):
    """Storage operations whose failures are counted."""

    OPEN = "open"
    READ = "read"
    WRITE = "write"
    DELETE = "delete"
    SYNC = "sync"
    SCAN = "scan"


REMOVAL_REASONS: tuple[str, ...] = ("evicted", "deleted", "corrupt", "other")
"""`ChunkRemoved.reason` values kept as labels; anything else is counted as "other"."""

SINK_NAMES: tuple[str, ...] = ("zmq", "jsonl")
"""The event sinks kvstore ships (their default names), whose series exist from the start."""

DROP_REASONS: tuple[str, ...] = ("queue_full", "closed", "deadline", "tier_down")
"""Why work or events were dropped: the queue was full, it was closed, or close timed out."""
AUDIT_RESULTS: tuple[str, ...] = ("verified", "mismatched", "unknown")  # kvstore.transfer.audit
LOAD_DECISIONS: tuple[str, ...] = ("load", "recompute", "gave_up")  # kvstore.pipeline.load_cost
LOAD_DECISION_TIERS: tuple[Tier, ...] = (Tier.DISK, Tier.REMOTE)  # the tiers `load_policy` judges

DURATION_BUCKETS_S: tuple[float, ...] = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
)
"""Transfer duration buckets, 100 µs to 10 s (a 1 MiB chunk over PCIe to a slow NVMe read)."""

SIZE_BUCKETS_BYTES: tuple[float, ...] = tuple(float(4096 * 4**i) for i in range(10))
"""Transfer size buckets, 4 KiB to 1 GiB in powers of four."""


def removal_reason(reason: str) -> str:
    """The label value for a removal reason: itself when known, else "other"."""
    return reason if reason in REMOVAL_REASONS else "other"
