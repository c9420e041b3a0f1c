"""The one typer app every `kvstore` command registers on."""

from __future__ import annotations

import typer

__all__ = ["app"]

app = typer.Typer(
    name="kvstore",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    help="Inspect, verify and manage a kvstore (the KV-cache offload store for vLLM).",
)


@app.callback()
def _root() -> None:
    """kvstore: a multi-tier KV-cache offload store for vLLM."""


@app.command()
def version() -> None:
    """Print the kvstore version."""
    from kvstore import __version__

    typer.echo(__version__)
