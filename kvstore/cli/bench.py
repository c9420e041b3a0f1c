"""`kvstore bench`: run the benchmark suites (`kvstore.bench`, or `benchmarks/` of a checkout).

Every suite measures against a baseline in the same run (raw copies, raw file I/O, recompute),
because shared machines are noisy; results and their reading are in `benchmarks/README.md`.
"""

from __future__ import annotations

import importlib.util
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
    REMOTE = "remote"
    ALL = "all"


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def bench(
    ctx: typer.Context,
    suite: Annotated[Suite, typer.Argument(help="Which suite to run.")] = Suite.ALL,
) -> None:
    """Run benchmark suites (extra arguments go to the suite, e.g. `connector --check`)."""
    suites = [s for s in Suite if s is not Suite.ALL] if suite is Suite.ALL else [suite]
    for name in suites:
        command = _command(name)
        typer.echo(f"== {name.value}: {' '.join(command[1:])}", err=True)
        done = subprocess.run([*command, *ctx.args], check=False)
        if done.returncode != 0:
            typer.echo(f"error: suite {name.value} exited {done.returncode}", err=True)
            raise typer.Exit(1)


def _command(suite: Suite) -> list[str]:
    """The packaged suite when there is one, else the source checkout's script."""
    if importlib.util.find_spec(f"kvstore.bench.{suite.value}") is not None:
        return [sys.executable, "-m", f"kvstore.bench.{suite.value}"]
    script = _BENCH_DIR / f"bench_{suite.value}.py"
    if not script.is_file():
        typer.echo(
            f"error: suite {suite.value} needs a source checkout ({script} not found)", err=True
        )
        raise typer.Exit(2)
    return [sys.executable, str(script)]
