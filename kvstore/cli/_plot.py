"""A PNG of hit ratio against tier size for `kvstore simulate --sweep --plot` (matplotlib, Agg)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from kvstore.cli._common import format_bytes
from kvstore.errors import ConfigError
from kvstore.simulate import SimulationResult

__all__ = ["plot_sweep"]


def _series_key(result: SimulationResult, vary_cpu: bool, chunk_bytes: int) -> str:
    if vary_cpu:
        disk = result.disk_capacity_bytes
        other = f"disk {format_bytes(disk)}" if disk else "no disk tier"
    else:
        other = f"cpu {format_bytes(result.num_cpu_rows * chunk_bytes)}"
    remote = result.remote_capacity_bytes
    return f"{result.policy}, {other}" + (f", remote {format_bytes(remote)}" if remote else "")


def plot_sweep(
    results: Sequence[SimulationResult], path: Path, *, chunk_bytes: int, title: str
) -> None:
    """Hit ratio (every offload tier, and CPU alone dashed) against the size that varies; one
    line per policy and size of the other tiers. The x axis is the CPU size unless only disk
    sizes vary."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise ConfigError("--plot needs matplotlib: pip install 'kvstore-vllm[plot]'") from exc
    vary_cpu = (
        len({r.num_cpu_rows for r in results}) > 1
        or len({r.disk_capacity_bytes for r in results}) == 1
    )
    series: dict[str, list[SimulationResult]] = {}
    for result in results:
        series.setdefault(_series_key(result, vary_cpu, chunk_bytes), []).append(result)

    def size(result: SimulationResult) -> int:
        return result.num_cpu_rows * chunk_bytes if vary_cpu else result.disk_capacity_bytes

    ticks = sorted({size(result) for result in results})  # equally spaced, labelled by size
    figure, axes = plt.subplots(figsize=(7, 4.5), dpi=100)
    try:
        for label, points in series.items():
            xs = [ticks.index(size(r)) for r in points]
            line = axes.plot(xs, [100 * r.hit_ratio for r in points], marker="o", label=label)
            if vary_cpu:
                asked = [max(r.num_chunks - r.num_engine_hit_chunks, 1) for r in points]
                cpu = [100 * r.num_cpu_hit_chunks / n for r, n in zip(points, asked, strict=True)]
                axes.plot(xs, cpu, linestyle="--", color=line[0].get_color(), alpha=0.6)
        axes.set_xticks(range(len(ticks)), [format_bytes(tick) for tick in ticks])
        axes.set_xlabel(f"{'CPU' if vary_cpu else 'disk'} tier size")
        axes.set_ylabel("offload hit ratio (%)" + (", dashed: CPU only" if vary_cpu else ""))
        axes.set_ylim(0, 100)
        axes.set_title(title)
        axes.grid(True, alpha=0.3)
        axes.legend(fontsize="small")
        figure.tight_layout()
        figure.savefig(path, format="png")
    finally:
        plt.close(figure)
