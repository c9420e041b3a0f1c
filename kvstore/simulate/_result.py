"""What a replay counts: `SimulationResult` (one engine, or one replica's share) and
`ReplicaSimulation` (every replica of one replay)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

__all__ = ["COUNTED", "ReplicaSimulation", "SimulationResult"]


@dataclass(frozen=True, slots=True)
class SimulationResult:
    """Hit counts of one replay (or one replica's share of it), in chunks; `*_tokens` properties
    multiply by the chunk size. The remote counts stay 0 without a remote tier."""

    policy: str
    num_cpu_rows: int
    disk_capacity_bytes: int
    num_tokens_per_chunk: int
    remote_capacity_bytes: int = 0
    num_requests: int = 0
    num_prompt_tokens: int = 0
    num_chunks: int = 0
    num_engine_hit_chunks: int = 0
    num_cpu_hit_chunks: int = 0
    num_disk_hit_chunks: int = 0
    num_promoted_chunks: int = 0
    num_stored_chunks: int = 0
    num_written_chunks: int = 0
    num_cpu_evicted_chunks: int = 0
    num_disk_evicted_chunks: int = 0
    num_remote_hit_chunks: int = 0  # fetched from the shared tier into CPU rows
    num_remote_written_chunks: int = 0  # computed here, written to the shared tier
    num_remote_evicted_chunks: int = 0  # evicted from the shared tier by those writes

    @property
    def num_hit_chunks(self) -> int:
        """Chunks served from the offload tiers (CPU, disk or remote), not counting the
        engine's own."""
        return self.num_cpu_hit_chunks + self.num_disk_hit_chunks + self.num_remote_hit_chunks

    @property
    def num_miss_chunks(self) -> int:
        """Full chunks the engine had to compute."""
        return self.num_chunks - self.num_engine_hit_chunks - self.num_hit_chunks

    @property
    def num_cpu_hit_tokens(self) -> int:
        return self.num_cpu_hit_chunks * self.num_tokens_per_chunk

    @property
    def num_disk_hit_tokens(self) -> int:
        return self.num_disk_hit_chunks * self.num_tokens_per_chunk

    @property
    def num_remote_hit_tokens(self) -> int:
        return self.num_remote_hit_chunks * self.num_tokens_per_chunk

    @property
    def num_hit_tokens(self) -> int:
        return self.num_hit_chunks * self.num_tokens_per_chunk

    @property
    def hit_ratio(self) -> float:
        """Offload-tier hits over the chunks the engine did not have (0 when there were none)."""
        num_asked = self.num_chunks - self.num_engine_hit_chunks
        return self.num_hit_chunks / num_asked if num_asked else 0.0

    def as_row(self) -> dict[str, int | float | str]:
        """A flat dict for tables and JSON, derived counts included."""
        row: dict[str, int | float | str] = asdict(self)
        row.update(
            num_hit_chunks=self.num_hit_chunks,
            num_miss_chunks=self.num_miss_chunks,
            num_cpu_hit_tokens=self.num_cpu_hit_tokens,
            num_disk_hit_tokens=self.num_disk_hit_tokens,
            num_remote_hit_tokens=self.num_remote_hit_tokens,
            hit_ratio=round(self.hit_ratio, 6),
        )
        return row


# The counts a replay tallies (every int field of SimulationResult but the configuration).
COUNTED = (
    "num_requests",
    "num_prompt_tokens",
    "num_chunks",
    "num_engine_hit_chunks",
    "num_cpu_hit_chunks",
    "num_disk_hit_chunks",
    "num_promoted_chunks",
    "num_stored_chunks",
    "num_written_chunks",
    "num_cpu_evicted_chunks",
    "num_disk_evicted_chunks",
    "num_remote_hit_chunks",
    "num_remote_written_chunks",
    "num_remote_evicted_chunks",
)


@dataclass(frozen=True, slots=True)
class ReplicaSimulation:
    """One replay over several replicas: each one's result, and all of them together."""

    routing: str
    replicas: tuple[SimulationResult, ...]

    @property
    def overall(self) -> SimulationResult:
        """Every count summed over the replicas (the sizes are each replica's)."""
        totals = {name: sum(getattr(r, name) for r in self.replicas) for name in COUNTED}
        return replace(self.replicas[0], **totals)
