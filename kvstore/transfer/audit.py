"""The load audit: each loaded chunk's bytes, as the load job wrote them into the engine's
blocks, against the digest of the bytes gathered when the chunk was stored.

With `audit_loads` on, a worker records the xxh64 of each chunk slice right after a store job
gathered it from the engine's blocks into the CPU row (before it ever leaves the worker). After
each load it gathers the blocks the load job scattered into back into a scratch copy and
compares that digest with the recorded one. A difference is counted, logged, and reported to
vLLM as a load error, so the request is recomputed instead of served from bad KV.

What it checks, exactly: that the bytes between the store's gather and the load's scatter did
not change. It catches a damaged CPU row, a disk value that slipped past its checksum, a row
read for the wrong key (a row holding another chunk) and a copy that wrote the wrong bytes. It
**cannot** catch wrong block ids in the jobs: the digest is taken over whatever the store
gathered, so a gather from the wrong blocks records the wrong bytes as the truth, and the check
regathers from the very block ids the load scattered into, so a load into the wrong blocks
reads its own bytes back. `kvstore.oracle.compare_kv` (the KV a load left in the blocks vLLM
allocated, against a reference engine's) covers those. A chunk stored by another process (e.g.
before a restart) has no digest here and is counted `unknown`, not verified.

It is a debugging and testing aid (the demo and the engine tests turn it on): it keeps one
digest per stored chunk in the worker and re-reads every loaded chunk.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum

import torch
import xxhash

from kvstore.keys import short_hex

__all__ = ["AuditCounts", "AuditResult", "LoadAudit"]

logger = logging.getLogger(__name__)


class AuditResult(StrEnum):
    VERIFIED = "verified"  # the loaded blocks equal what was stored
    MISMATCHED = "mismatched"  # they differ: the load is reported as failed
    UNKNOWN = "unknown"  # stored by another process (e.g. before a restart): nothing to compare


@dataclass(slots=True)
class AuditCounts:
    verified: int = 0
    mismatched: int = 0
    unknown: int = 0

    def add(self, result: AuditResult) -> None:
        setattr(self, result.value, getattr(self, result.value) + 1)

    def to_dict(self) -> dict[str, int]:
        return {"verified": self.verified, "mismatched": self.mismatched, "unknown": self.unknown}

    @property
    def is_empty(self) -> bool:
        return not (self.verified or self.mismatched or self.unknown)


def digest(buffer: torch.Tensor) -> int:
    """xxh64 of a contiguous uint8 CPU tensor's bytes."""
    return int(xxhash.xxh64_intdigest(buffer.numpy().data))


class LoadAudit:
    """Digests of stored chunk slices, checked after loads. One per worker (per TP rank)."""

    def __init__(self) -> None:
        self._digests: dict[bytes, int] = {}
        self._counts = AuditCounts()

    def record_store(self, key: bytes, stored: torch.Tensor) -> None:
        """`stored`: the chunk slice just gathered from the engine's blocks."""
        if key:
            self._digests[key] = digest(stored)

    def check_load(
        self, key: bytes, row: torch.Tensor, regather: Callable[[torch.Tensor], None]
    ) -> AuditResult:
        """`row`: the slice the load read; `regather(scratch)` gathers the engine blocks the
        load wrote into `scratch` (a copy of `row`, so positions the load did not cover keep
        the row's bytes)."""
        expected = self._digests.get(key)
        if expected is None:
            result = AuditResult.UNKNOWN
        else:
            scratch = row.clone()
            regather(scratch)
            result = AuditResult.VERIFIED if digest(scratch) == expected else AuditResult.MISMATCHED
        if result is AuditResult.MISMATCHED:
            logger.error(
                "kvstore audit: chunk %s loaded into the engine differs from the bytes stored; "
                "reported as a load error (vLLM recomputes it)",
                short_hex(key),
            )
        self._counts.add(result)
        return result

    def take_counts(self) -> AuditCounts:
        counts, self._counts = self._counts, AuditCounts()
        return counts
