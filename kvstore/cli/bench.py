"""`kvstore bench`: run the benchmark suites that ship with kvstore (`kvstore.bench`).

Every suite measures against a baseline in the same run (raw copies, raw file I/O, recompute),
because shared machines are noisy; results and their reading are in `benchmarks/README.md`.
"""

from __future__ import annotations

import subprocess
import sys
from enum import StrEnum
from typing import Annotated

import typer

from kvstore.cli.app import app


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
    everyday = (Suite.TIERS, Suite.INDEX, Suite.CONNECTOR)  # remote needs a Redis
    suites = list(everyday) if suite is Suite.ALL else [suite]
    for name in suites:
        command = _command(name)
        typer.echo(f"== {name.value}: {' '.join(command[1:])}", err=True)
        done = subprocess.run([*command, *ctx.args], check=False)
        if done.returncode != 0:
            typer.echo(f"error: suite {name.value} exited {done.returncode}", err=True)
            raise typer.Exit(1)


def _command(suite: Suite) -> list[str]:
    return [sys.executable, "-m", f"kvstore.bench.{suite.value}"]
