"""Keep vLLM's and torch's output off the demo's terminal: it goes to a log file instead.

vLLM logs through its own `vllm` logger, torch's C++ code writes straight to file descriptor 2,
tqdm bars (checkpoint loading) and Python warnings write to `sys.stderr`: only redirecting the
descriptors catches all of them. `engine_output` points descriptors 1 and 2 at the log for the
duration of the engine work and hands back a rich console on a duplicate of the original stderr,
the one place kvstore's own lines (progress, warnings, errors) still reach the terminal. Verbose,
descriptor 2 stays on the terminal and descriptor 1 joins it, so stdout stays clean for `--json`
either way. Everything is restored on exit, errors included.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from rich.console import Console
from rich.markup import escape

__all__ = ["EngineOutput", "engine_output"]

_STDOUT_FD, _STDERR_FD = 1, 2


@dataclass(frozen=True, slots=True)
class EngineOutput:
    """Where the engine's output went, and the console that still reaches the terminal."""

    console: Console
    log_path: Path | None  # None when verbose: the engine's output is on the terminal


class _TerminalHandler(logging.Handler):
    """kvstore's own warnings and errors, as one line each on the terminal console."""

    def __init__(self, console: Console) -> None:
        super().__init__(logging.WARNING)
        self._console = console

    def emit(self, record: logging.LogRecord) -> None:
        try:
            colour = "red" if record.levelno >= logging.ERROR else "yellow"
            message = escape(record.getMessage())
            line = f"[{colour}]{record.levelname.lower()}:[/{colour}] {message}"
            self._console.print(line, soft_wrap=True)
        except Exception:  # logging.Handler's contract: report, never raise
            self.handleError(record)


@contextlib.contextmanager
def engine_output(log_path: Path, *, verbose: bool) -> Iterator[EngineOutput]:
    """Send descriptors 1 and 2 to `log_path` (truncated) until exit, or, `verbose`, descriptor
    1 to the terminal's stderr; yield the console that writes to the original stderr."""
    _flush_all()
    saved_out, saved_err = os.dup(_STDOUT_FD), os.dup(_STDERR_FD)
    with contextlib.ExitStack() as stack:
        stack.callback(os.close, saved_out)
        stack.callback(os.close, saved_err)
        terminal: IO[str] = stack.enter_context(
            os.fdopen(os.dup(saved_err), "w", buffering=1, encoding="utf-8", errors="replace")
        )
        console = Console(file=terminal, highlight=False)
        if verbose:
            target_fd = saved_err
        else:
            log = stack.enter_context(log_path.open("w", encoding="utf-8"))
            target_fd = log.fileno()
        stack.callback(_restore, saved_out, saved_err)
        os.dup2(target_fd, _STDOUT_FD)
        if not verbose:
            os.dup2(target_fd, _STDERR_FD)
            stack.enter_context(_kvstore_warnings_to(console))
        yield EngineOutput(console=console, log_path=None if verbose else log_path)


@contextlib.contextmanager
def _kvstore_warnings_to(console: Console) -> Iterator[None]:
    """kvstore's warnings reach the terminal too (they still reach the log through the root)."""
    handler = _TerminalHandler(console)
    logger = logging.getLogger("kvstore")
    logger.addHandler(handler)
    try:
        yield
    finally:
        logger.removeHandler(handler)


def _restore(saved_out: int, saved_err: int) -> None:
    _flush_all()
    os.dup2(saved_out, _STDOUT_FD)
    os.dup2(saved_err, _STDERR_FD)


def _flush_all() -> None:
    """Flush Python's and C's buffered streams, so nothing written before a switch lands after."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # closed or detached by the host
            stream.flush()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).fflush(None)
