"""The `kvstore` command line: one typer app; each module below registers its commands on it.

Conventions for every command: read commands take `--json` and then print exactly one JSON
document on stdout; human output is a rich table; progress and logs go to stderr; exit codes are
0 ok, 1 operational failure, 2 usage.
"""

from __future__ import annotations

# Command modules register on `app` when imported (one line each, keep sorted).
from kvstore.cli import bench as _bench  # noqa: F401
from kvstore.cli import demo as _demo  # noqa: F401
from kvstore.cli import listing as _listing  # noqa: F401
from kvstore.cli import manage as _manage  # noqa: F401
from kvstore.cli import serve as _serve  # noqa: F401
from kvstore.cli import show as _show  # noqa: F401
from kvstore.cli import simulate_cmd as _simulate_cmd  # noqa: F401
from kvstore.cli import size as _size  # noqa: F401
from kvstore.cli import verify as _verify  # noqa: F401
from kvstore.cli import watch as _watch  # noqa: F401
from kvstore.cli.app import app

__all__ = ["app", "main"]


def main() -> None:
    app()
