"""The one typer app every `kvstore` command registers on."""

from __future__ import annotations

from typing import Any

import typer
import typer.core

__all__ = ["app"]


def _flag_type(self: typer.core.TyperOption, ctx: Any) -> str | None:
    """Typer 0.29 prints `<bool>` in the type column of every flag (`--help <bool>`, `--json
    <bool>`), as if it took a value; a flag's type column stays empty, as it did before."""
    return None if self.is_flag else _typer_type(self, ctx)


_typer_type = typer.core.TyperOption.display_type_rich
typer.core.TyperOption.display_type_rich = _flag_type  # type: ignore[method-assign]

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
