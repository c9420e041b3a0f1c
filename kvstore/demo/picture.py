"""The demo's picture: each turn's prompt tokens, stacked by who served them (matplotlib, Agg).

matplotlib comes with the `plot` extra; without it `has_matplotlib()` is False and the report
prints `PLOT_HINT` instead.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kvstore.demo.runner import TurnStats

__all__ = ["PLOT_HINT", "SERIES", "draw_turns", "has_matplotlib"]

PLOT_HINT = "pip install 'kvstore-vllm[plot]' to draw the tokens per turn into a picture"

# (label, colour) from the bottom of each bar up.
SERIES = (
    ("engine cache", "#9e9e9e"),
    ("kvstore CPU", "#1f77b4"),
    ("kvstore disk", "#ff7f0e"),
    ("computed", "#d62728"),
)


def has_matplotlib() -> bool:
    return importlib.util.find_spec("matplotlib") is not None


def draw_turns(turns: Sequence[TurnStats], path: Path) -> Path:
    """Write a PNG of stacked bars, one per turn: tokens served by the engine's own prefix
    cache, kvstore's CPU tier, kvstore's disk tier, and computed. Returns `path`."""
    from matplotlib.figure import Figure  # no pyplot: no global state, no display

    columns = [
        [t.engine_cache_tokens for t in turns],
        [t.cpu_tokens for t in turns],
        [t.disk_tokens for t in turns],
        [t.computed_tokens for t in turns],
    ]
    xs = [t.turn + 1 for t in turns]
    figure = Figure(figsize=(7, 4), dpi=100)
    axes = figure.subplots()
    bottoms = [0] * len(turns)
    for (label, colour), heights in zip(SERIES, columns, strict=True):
        axes.bar(xs, heights, bottom=bottoms, label=label, color=colour, width=0.7)
        bottoms = [b + h for b, h in zip(bottoms, heights, strict=True)]
    axes.set_xticks(xs)
    axes.set_xlabel("turn (every conversation sends its whole history again)")
    axes.set_ylabel("prompt tokens")
    axes.set_title("kvstore demo: who served each turn's prompt tokens")
    axes.grid(True, axis="y", alpha=0.3)
    axes.set_axisbelow(True)
    axes.legend(loc="upper left", fontsize="small")
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, format="png")
    return path
