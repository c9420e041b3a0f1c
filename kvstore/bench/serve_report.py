"""The report of `kvstore bench serve`: per target, TTFT and throughput from vLLM's benchmark
client and where the prompt tokens came from (vLLM's `/metrics`); ratios to the baseline in
the same run; the printed table, the JSON and the PNG."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "BASELINE",
    "METRICS",
    "SOURCES",
    "TargetResult",
    "format_report",
    "plot_report",
    "ratios",
]

BASELINE = "baseline"
"""The target every ratio divides by: the same server without any KV connector."""

METRICS: tuple[tuple[str, str, bool], ...] = (
    ("mean_ttft_ms", "mean TTFT ms", False),
    ("median_ttft_ms", "median TTFT ms", False),
    ("p99_ttft_ms", "p99 TTFT ms", False),
    ("request_throughput", "requests/s", True),
    ("output_throughput", "output tok/s", True),
)
"""(key in vLLM's result JSON, label, higher is better)."""

SOURCES: tuple[tuple[str, str], ...] = (
    ("computed", "computed"),
    ("device", "engine prefix cache"),
    ("host", "CPU tier (host)"),
    ("disk", "disk tier"),
    ("external_unspecified", "other external"),
    ("p2p", "p2p"),
)
_COLOURS = {"computed": "#9e9e9e", "device": "#4c72b0", "host": "#55a868", "disk": "#dd8452",
            "external_unspecified": "#8172b3", "p2p": "#c44e52"}  # fmt: skip
"""Where prompt tokens came from: `computed` from vLLM's `prompt_tokens_by_source`
(`local_compute`), the others the `source` label of `prompt_tokens_cached_by_source`."""


@dataclass(frozen=True)
class TargetResult:
    """One target's run: vLLM's benchmark result (`bench`) and prompt-token sources."""

    name: str
    description: str
    bench: Mapping[str, Any]
    sources: Mapping[str, float] = field(default_factory=dict)

    def metric(self, key: str) -> float:
        return float(self.bench[key])


def ratios(
    results: Mapping[str, TargetResult], baseline: str = BASELINE
) -> dict[str, dict[str, float]]:
    """Each other target's `METRICS` divided by the baseline's (TTFT below 1 and throughput
    above 1 are better); nan where the baseline's value is 0. Empty without a baseline."""
    base = results.get(baseline)
    if base is None:
        return {}
    out: dict[str, dict[str, float]] = {}
    for name, result in results.items():
        if name == baseline:
            continue
        row = {}
        for key, _, _ in METRICS:
            denominator = base.metric(key)
            row[key] = result.metric(key) / denominator if denominator else math.nan
        out[name] = row
    return out


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    lines = []
    for row in [header, *rows]:
        cells = [row[0].ljust(widths[0])] + [
            c.rjust(w) for c, w in zip(row[1:], widths[1:], strict=True)
        ]
        lines.append("  ".join(cells))
    return lines


def format_report(
    results: Mapping[str, TargetResult], skipped: Mapping[str, str], header: Sequence[str]
) -> str:
    """The printed report: `header` lines (machine, layout, workload), a metrics table, the
    prompt-token sources, the ratios to the baseline, and the skipped targets."""
    lines = list(header)
    names = list(results)
    rows = [[label, *(f"{results[n].metric(key):.2f}" for n in names)] for key, label, _ in METRICS]
    rows.append(["completed/failed", *(_completed(results[n]) for n in names)])
    lines += ["", *_table(["", *names], rows), "", "prompt tokens by source (vLLM /metrics):"]
    source_rows = []
    for key, label in SOURCES:
        values = [results[n].sources.get(key, 0.0) for n in names]
        if key in ("computed", "device", "host", "disk") or any(values):
            source_rows.append(
                [label, *(_share(v, results[n]) for v, n in zip(values, names, strict=True))]
            )
    source_rows.append(["total", *(f"{results[n].sources.get('total', 0):,.0f}" for n in names)])
    lines += _table(["", *names], source_rows)
    for name, row in ratios(results).items():
        parts = [f"{label} {row[key]:.2f}x" for key, label, _ in METRICS]
        lines += ["", f"{name} / {BASELINE}: " + ", ".join(parts)]
    lines += [f"{name}: skipped: {why}" for name, why in skipped.items()]
    return "\n".join(lines)


def _completed(result: TargetResult) -> str:
    return f"{int(result.bench.get('completed', 0))}/{int(result.bench.get('failed', 0))}"


def _share(value: float, result: TargetResult) -> str:
    total = result.sources.get("total", 0.0)
    return f"{value:,.0f} ({100 * value / total:.0f}%)" if total else f"{value:,.0f}"


def plot_report(results: Mapping[str, TargetResult], path: Path, title: str) -> None:
    """Two panels: TTFT (mean, median, p99) per target, and its prompt tokens by source."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(results)
    figure, (left, right) = plt.subplots(1, 2, figsize=(10, 4.2), dpi=80)
    try:
        width = 0.8 / 3
        for i, (key, label) in enumerate(
            (("mean_ttft_ms", "mean"), ("median_ttft_ms", "median"), ("p99_ttft_ms", "p99"))
        ):
            xs = [n + (i - 1) * width for n in range(len(names))]
            left.bar(xs, [results[n].metric(key) for n in names], width, label=label)
        left.set_xticks(range(len(names)), names)
        left.set_ylabel("time to first token (ms)")
        left.legend(fontsize="small", ncol=3, loc="upper center")
        left.set_ylim(0, 1.2 * left.get_ylim()[1])
        left.grid(True, axis="y", alpha=0.3)
        bottoms = [0.0] * len(names)
        for key, label in SOURCES:
            values = [results[n].sources.get(key, 0.0) for n in names]
            if any(values):
                right.bar(range(len(names)), values, 0.6, bottom=bottoms, label=label,
                          color=_COLOURS[key])  # fmt: skip
                bottoms = [b + v for b, v in zip(bottoms, values, strict=True)]
        right.set_xticks(range(len(names)), names)
        right.set_ylabel("prompt tokens, by where they came from")
        right.set_ylim(0, 1.35 * max([*bottoms, 1.0]))  # room for the legend
        right.legend(fontsize="small", ncol=2, loc="upper center")
        right.grid(True, axis="y", alpha=0.3)
        figure.suptitle(title, fontsize="medium")
        figure.tight_layout()
        figure.savefig(path, format="png")
    finally:
        plt.close(figure)
