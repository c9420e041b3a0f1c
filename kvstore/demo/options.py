"""What `run_demo` runs: sizes of the workload and the tiers (light: no torch, no vLLM)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

__all__ = ["DemoOptions"]


@dataclass(frozen=True, slots=True)
class DemoOptions:
    directory: Path = Path(".kvstore")
    num_conversations: int = 6
    num_turns: int = 6
    engine_kv_blocks: int = 64  # the engine's own KV cache: 2048 tokens, far less than the history
    cpu_chunks: int = 96  # kvstore's CPU tier: 3072 tokens, also less than the history
    disk_bytes: int = 256 << 20
    metrics_port: int | None = 0  # 0 = any free port
    compare_baseline: bool = True

    @property
    def store_path(self) -> Path:
        return self.directory / "store"

    @property
    def model_path(self) -> Path:
        return self.directory / "model"

    @property
    def num_requests(self) -> int:
        return self.num_conversations * self.num_turns
