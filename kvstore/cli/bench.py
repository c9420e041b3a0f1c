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
    NOHIT = "nohit"
    SERVE = "serve"
    HYBRID = "hybrid"
    ALL = "all"


# No help option of its own: `kvstore bench connector --help` is the suite's help (click's
# option would answer with this command's); `kvstore bench --help` is this command's.
@app.command(
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    add_help_option=False,
)
def bench(
    ctx: typer.Context,
    suite: Annotated[
        Suite | None, typer.Argument(help="Which suite to run (default: all).")
    ] = None,
    wants_help: Annotated[
        bool, typer.Option("--help", help="This help; after a SUITE, the suite's options.")
    ] = False,
) -> None:
    """Run benchmark suites (extra arguments go to the suite, e.g. `connector --check`)."""
    if wants_help and suite is None:
        typer.echo(ctx.get_help())
        raise typer.Exit(0)
    extra = [*ctx.args, "--help"] if wants_help else list(ctx.args)
    suite = Suite.ALL if suite is None else suite
    # remote needs a Redis; nohit, serve and hybrid take minutes: each is run on its own
    everyday = (Suite.TIERS, Suite.INDEX, Suite.CONNECTOR)
    suites = list(everyday) if suite is Suite.ALL else [suite]
    for name in suites:
        command = _command(name)
        typer.echo(f"== {name.value}: {' '.join(command[1:])}", err=True)
        done = subprocess.run([*command, *extra], check=False)
        if done.returncode != 0:
            typer.echo(f"error: suite {name.value} exited {done.returncode}", err=True)
            raise typer.Exit(1)


def _command(suite: Suite) -> list[str]:
    return [sys.executable, "-m", f"kvstore.bench.{suite.value}"]
