"""`kvstore bench`: run the benchmark suites of a source checkout (`benchmarks/`).

Every suite measures against a baseline in the same run (raw copies, raw file I/O, recompute),
because shared machines are noisy; results and their reading are in `benchmarks/README.md`.
"""

from __future__ import annotations

import subprocess
import sys
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer

from kvstore.cli.app import app

_BENCH_DIR = Path(__file__).resolve().parents[2] / "benchmarks"


class Suite(StrEnum):
    TIERS = "tiers"
    INDEX = "index"
    CONNECTOR = "connector"
    ALL = "all"


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def bench(
    ctx: typer.Context,
    suite: Annotated[Suite, typer.Argument(help="Which suite to run.")] = Suite.ALL,
) -> None:
    """Run benchmark suites (extra arguments go to the suite's script)."""
    if not _BENCH_DIR.is_dir():
        typer.echo(
            f"error: no benchmarks/ beside this kvstore ({_BENCH_DIR}); run from a source checkout",
            err=True,
        )
        raise typer.Exit(2)
    suites = [s for s in Suite if s is not Suite.ALL] if suite is Suite.ALL else [suite]
    for name in suites:
        script = _BENCH_DIR / f"bench_{name.value}.py"
        typer.echo(f"== {name.value}: {script}", err=True)
        done = subprocess.run([sys.executable, str(script), *ctx.args], check=False)
        if done.returncode != 0:
            typer.echo(f"error: suite {name.value} exited {done.returncode}", err=True)
            raise typer.Exit(1)
