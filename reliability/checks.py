"""What every fault test holds the code to, and the in-process CLI it drives.

`Crash` is a broken promise (an exception of a foreign type escaping, a hang, a signal, a CLI
that prints a traceback); `WrongData` is the worst one: bytes handed back that are not the bytes
stored. `run_cli` runs `kvstore ...` in this process; `check_cli` holds a result to the CLI's
promise: exit 0, 1 or 2, and on failure exactly one `error:` line on stderr, no traceback.
"""

from __future__ import annotations

import io
from functools import cache
from typing import Any
from unittest import mock

import typer
import typer.testing
from typer.testing import CliRunner, Result

__all__ = ["Crash", "WrongData", "check_cli", "run_cli"]

_CLI_EXIT_CODES = (0, 1, 2)


class Crash(AssertionError):
    """The code under test failed in a way the rule forbids (the message says how)."""


class WrongData(Crash):
    """The code under test returned data other than what was stored."""


_runner = CliRunner()


@cache
def _app() -> tuple[typer.Typer, Any]:
    from kvstore.cli import app

    return app, typer.main.get_command(app)


def run_cli(*args: object, stdin: str | None = None) -> Result:
    """Run `kvstore ARGS...` in this process with typer's test runner, reusing one built
    command (typer rebuilds it on every invocation, ~30 ms: most of a fuzz example)."""
    app, command = _app()
    with mock.patch.object(typer.testing, "_get_command", lambda _: command):
        return _runner.invoke(app, [str(arg) for arg in args], input=stdin)


def check_cli(result: Result, command: str) -> None:
    """The CLI's promise: exit 0, 1 or 2; on failure a one-line `error:` on stderr, and never
    a traceback or an exception escaping the command."""
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        error = result.exception
        raise Crash(f"kvstore {command}: {type(error).__name__}: {str(error)[:300]}")
    output = result.stdout + result.stderr
    if "Traceback" in output:
        raise Crash(f"kvstore {command} printed a traceback: {output[-300:]!r}")
    if result.exit_code not in _CLI_EXIT_CODES:
        raise Crash(f"kvstore {command} exited {result.exit_code}")
    if result.exit_code != 0:
        lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
        if len(lines) != 1:
            raise Crash(
                f"kvstore {command} exited {result.exit_code} without exactly one error line: "
                f"{io.StringIO(result.stderr).read()[-300:]!r}"
            )
