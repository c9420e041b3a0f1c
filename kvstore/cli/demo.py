"""`kvstore demo`: the main job, on the embedded default (tiny local model, CPU engine).

The terminal shows kvstore's lines only: progress bars over the turns, then the report, the
picture's path and what to do next. vLLM's and torch's own output goes to `<dir>/vllm.log`
(`-v` shows it on stderr instead); a failure prints one line naming the error and the log.
"""

from __future__ import annotations

import logging
import os
import traceback
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer
from rich.console import Console
from rich.markup import escape

from kvstore.cli._common import EXIT_FAILURE, emit_json, err_console, fail
from kvstore.cli.app import app

if TYPE_CHECKING:
    from kvstore.demo.console import EngineOutput
    from kvstore.demo.options import DemoOptions
    from kvstore.demo.report import DemoFiles
    from kvstore.demo.runner import DemoResult

LOG_NAME = "vllm.log"
PICTURE_NAME = "demo.png"


@app.command()
def demo(
    directory: Annotated[Path, typer.Option("--dir", help="Where the model and store go.")] = Path(
        ".kvstore"
    ),
    conversations: Annotated[int, typer.Option(min=1, help="Concurrent conversations.")] = 6,
    turns: Annotated[int, typer.Option(min=1, help="Turns per conversation.")] = 6,
    baseline: Annotated[
        bool, typer.Option(help="Also run without kvstore and compare outputs.")
    ] = True,
    metrics_port: Annotated[int, typer.Option(help="Metrics port (0 = any free port).")] = 0,
    verbose: Annotated[
        bool,
        typer.Option(
            "-v", "--verbose", help=f"vLLM's own output on stderr, not in DIR/{LOG_NAME}."
        ),
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON document on stdout.")] = False,
) -> None:
    """Run the real vLLM engine with KVStoreConnector on a multi-turn chat workload."""
    from kvstore.demo.options import DemoOptions  # the demo's modules load when it runs
    from kvstore.demo.picture import PLOT_HINT, has_matplotlib
    from kvstore.demo.report import report_data

    _configure_logging(verbose=verbose)
    options = DemoOptions(
        directory=directory,
        num_conversations=conversations,
        num_turns=turns,
        metrics_port=metrics_port,
        compare_baseline=baseline,
    )
    result, files = _run(options, verbose=verbose)
    data = report_data(result, files)
    if as_json:
        emit_json(data)
        if not has_matplotlib():
            err_console().print(escape(PLOT_HINT))
    else:
        _print_human(data, files, directory)
    if not result.is_correct:
        err_console().print(
            f"[red]kvstore demo: the correctness check FAILED: {escape(data['oracle'])}[/red]"
        )
        raise typer.Exit(EXIT_FAILURE)


def _configure_logging(*, verbose: bool) -> None:
    """vLLM logs to stderr (stdout is for the report): the terminal with -v, else the log."""
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING" if verbose else "INFO")
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    logging.basicConfig(level=logging.WARNING if verbose else logging.INFO)


def _run(options: DemoOptions, *, verbose: bool) -> tuple[DemoResult, DemoFiles]:
    """Both engine runs and the picture, with the engine's output sent to the log."""
    from kvstore.demo.console import engine_output
    from kvstore.demo.progress import DemoProgress
    from kvstore.demo.report import DemoFiles

    try:
        options.directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        fail(f"--dir {options.directory}: cannot create it ({exc.strerror})", EXIT_FAILURE)
    with engine_output(options.directory / LOG_NAME, verbose=verbose) as output:
        if output.log_path is not None:
            output.console.print(
                f"[dim]·[/dim] vLLM's and torch's output goes to {escape(str(output.log_path))}"
                " (-v shows it here)",
                soft_wrap=True,
            )
        progress = DemoProgress(
            output.console,
            num_requests=options.num_requests,
            num_turns=options.num_turns,
            has_reference=options.compare_baseline,
        )
        try:
            from kvstore.demo.runner import run_demo  # imports vLLM: its output goes to the log

            with progress:
                result = run_demo(options, on_progress=progress.message, on_turn=progress.turn)
            picture = _draw(result, options.directory / PICTURE_NAME, output.console)
        except Exception as exc:  # the command's boundary: one line here, the traceback logged
            _fail(exc, output)
    return result, DemoFiles(log_path=output.log_path, picture_path=picture)


def _draw(result: DemoResult, path: Path, console: Console) -> Path | None:
    from kvstore.demo.picture import draw_turns, has_matplotlib

    if not has_matplotlib():
        return None
    try:
        return draw_turns(result.turns, path)
    except OSError as exc:
        message = f"could not write {path}: {exc}"
        console.print(f"[yellow]warning:[/yellow] {escape(message)}", soft_wrap=True)
        return None


def _fail(exc: Exception, output: EngineOutput) -> NoReturn:
    traceback.print_exc()  # into the log (with -v: onto the terminal)
    message = " ".join(f"{type(exc).__name__}: {exc}".split())
    where = "" if output.log_path is None else f" (details in {output.log_path})"
    output.console.print(
        f"[red]error:[/red] kvstore demo failed: {escape(message + where)}", soft_wrap=True
    )
    raise typer.Exit(EXIT_FAILURE) from None


def _print_human(data: dict[str, Any], files: DemoFiles, directory: Path) -> None:
    from kvstore.demo.picture import PLOT_HINT, has_matplotlib
    from kvstore.demo.report import next_steps, print_next_steps, print_report

    console = Console()
    print_report(console, data)
    if files.picture_path is not None:
        picture = f"picture: {files.picture_path} (prompt tokens per turn, by who served them)"
        console.print(escape(picture), soft_wrap=True)
    elif not has_matplotlib():
        console.print(escape(PLOT_HINT))
    if files.log_path is not None:
        console.print(escape(f"vLLM's own output: {files.log_path}"), soft_wrap=True)
    console.print()
    print_next_steps(console, next_steps(directory))
