"""The index's configuration, validated on construction."""

from __future__ import annotations

from dataclasses import dataclass

from kvstore.errors import ConfigError
from kvstore.policies import POLICY_NAMES

__all__ = ["WRITE_POLICIES", "IndexConfig", "write_policy_problem"]

WRITE_POLICIES: tuple[str, ...] = ("write_through",)
"""The write policies the index implements."""

_WRITE_BACK_REASON = (
    "write_policy 'write_back' is not supported: it would keep evicted CPU rows pinned until "
    "their disk write completes, so stores would stall on disk I/O; write_through makes CPU "
    "eviction free instead. Allowed: 'write_through'"
)


def write_policy_problem(name: str) -> str | None:
    """Why `name` is not a write policy the index implements (None if it is one)."""
    if name == "write_back":
        return _WRITE_BACK_REASON
    if name not in WRITE_POLICIES:
        return f"write_policy {name!r} is unknown; allowed: 'write_through'"
    return None


def _check_int(name: str, value: int, minimum: int, hint: str = "") -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{name} must be an integer, got {value!r}")
    if value < minimum:
        raise ConfigError(f"{name} must be >= {minimum}{hint}, got {value}")


@dataclass(frozen=True, slots=True)
class IndexConfig:
    """Sizes and policies of the tiers the index manages.

    - `num_cpu_rows`: rows in the CPU region; a CPU chunk owns one row in `range(num_cpu_rows)`.
    - `chunk_bytes`: the size of one chunk (one CPU row, one disk value written through).
    - `num_tokens_per_chunk`: tokens one chunk covers (events carry it).
    - `disk_capacity_bytes`: the disk tier's budget; 0 means no disk tier.
    - `cpu_policy`, `disk_policy`: eviction policy names (see `kvstore.policies.POLICY_NAMES`).
    - `write_policy`: only `write_through` (every chunk stored to CPU is also written to disk).
    - `admission_min_sightings`: write a chunk to disk only once it was seen in this many lookups
      (1 turns the filter off).
    """

    num_cpu_rows: int
    chunk_bytes: int
    num_tokens_per_chunk: int
    disk_capacity_bytes: int = 0
    cpu_policy: str = "lru"
    disk_policy: str = "lru"
    write_policy: str = "write_through"
    admission_min_sightings: int = 1

    def __post_init__(self) -> None:
        _check_int("num_cpu_rows", self.num_cpu_rows, 1)
        _check_int("chunk_bytes", self.chunk_bytes, 1)
        _check_int("num_tokens_per_chunk", self.num_tokens_per_chunk, 1)
        _check_int("disk_capacity_bytes", self.disk_capacity_bytes, 0, " (0 = no disk tier)")
        if 0 < self.disk_capacity_bytes < self.chunk_bytes:
            raise ConfigError(
                f"disk_capacity_bytes must be 0 (no disk tier) or at least chunk_bytes "
                f"({self.chunk_bytes}), got {self.disk_capacity_bytes}"
            )
        allowed = ", ".join(repr(name) for name in POLICY_NAMES)
        for field_name, policy in (
            ("cpu_policy", self.cpu_policy),
            ("disk_policy", self.disk_policy),
        ):
            if policy not in POLICY_NAMES:
                raise ConfigError(f"{field_name} {policy!r} is unknown; allowed: {allowed}")
        problem = write_policy_problem(self.write_policy)
        if problem is not None:
            raise ConfigError(problem)
        _check_int("admission_min_sightings", self.admission_min_sightings, 1, " (1 = off)")

    @property
    def has_disk(self) -> bool:
        return self.disk_capacity_bytes > 0

    @property
    def cpu_capacity_bytes(self) -> int:
        return self.num_cpu_rows * self.chunk_bytes

    @property
    def num_disk_chunks(self) -> int:
        """The disk tier's capacity in chunks of `chunk_bytes` (what ARC sizes its ghosts by)."""
        return self.disk_capacity_bytes // self.chunk_bytes
