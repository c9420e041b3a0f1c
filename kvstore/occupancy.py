"""`Occupancy`: how full a tier is, the value the index reports and the metrics export."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Occupancy"]


@dataclass(frozen=True, slots=True)
class Occupancy:
    """How full a tier is. Rows are the CPU region's fixed-size slots (None for disk)."""

    used_bytes: int = 0
    capacity_bytes: int = 0
    num_entries: int = 0
    used_rows: int | None = None
    capacity_rows: int | None = None
