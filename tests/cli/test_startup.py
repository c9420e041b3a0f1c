"""The command starts fast: `--help` and the store commands never import torch, vLLM or the
Redis client; and the small defects of the help screens stay fixed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kvstore.cli import app

from .helpers import BuiltStore

_HEAVY = ("torch", "vllm", "redis", "numpy", "matplotlib", "transformers")

_PROBE = """
import json, sys
sys.argv = ["kvstore", *json.loads(sys.argv[1])]
from kvstore.cli import main
try:
    main()
except SystemExit:
    pass
heavy = [name for name in json.loads({heavy!r}) if name in sys.modules]
print("HEAVY=" + json.dumps(heavy))
"""


def _heavy_modules_after(*args: str) -> list[str]:
    code = _PROBE.replace("{heavy!r}", repr(json.dumps(list(_HEAVY))))
    done = subprocess.run(
        [sys.executable, "-c", code, json.dumps(list(args))],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])},
    )
    line = [row for row in done.stdout.splitlines() if row.startswith("HEAVY=")]
    assert line, done.stdout + done.stderr
    return list(json.loads(line[-1].removeprefix("HEAVY=")))


def test_help_imports_no_heavy_package() -> None:
    assert _heavy_modules_after("--help") == []


@pytest.mark.parametrize("command", ["stat", "ls"])
def test_store_commands_import_no_heavy_package(built: BuiltStore, command: str) -> None:
    assert _heavy_modules_after(command, str(built.path)) == []


def test_help_is_fast() -> None:
    """Issue 21 asks for under 0.5 s; a shared CI machine gets a margin (the figure is printed)."""
    kvstore = Path(sys.executable).with_name("kvstore")
    command = [str(kvstore)] if kvstore.exists() else [sys.executable, "-m", "kvstore.cli"]
    timings = []
    for _ in range(3):
        started = time.perf_counter()
        subprocess.run([*command, "--help"], capture_output=True, check=True, timeout=60)
        timings.append(time.perf_counter() - started)
    print(f"kvstore --help: best of 3 {min(timings):.2f} s")
    assert min(timings) < 1.5


def test_flags_show_no_type() -> None:
    """Typer 0.29 printed `<bool>` beside every flag, `--help` included."""
    for args in (["--help"], ["ls", "--help"], ["rm", "--help"]):
        result = CliRunner().invoke(app, args, terminal_width=120)
        assert result.exit_code == 0
        assert "<bool>" not in result.output
    assert "<int" in CliRunner().invoke(app, ["ls", "--help"], terminal_width=120).output


def test_bench_suite_help_is_the_suites(monkeypatch: pytest.MonkeyPatch) -> None:
    """`kvstore bench connector --help` used to print `kvstore bench`'s own help."""
    ran: list[list[str]] = []

    def fake_run(command: list[str], check: bool) -> subprocess.CompletedProcess[bytes]:
        ran.append(command)
        return subprocess.CompletedProcess(command, 0)

    monkeypatch.setattr("kvstore.cli.bench.subprocess.run", fake_run)
    result = CliRunner().invoke(app, ["bench", "connector", "--help"])
    assert result.exit_code == 0, result.output
    assert ran == [[sys.executable, "-m", "kvstore.bench.connector", "--help"]]
    own = CliRunner().invoke(app, ["bench", "--help"])
    assert own.exit_code == 0
    assert "Which suite to run" in own.output
    assert ran == [[sys.executable, "-m", "kvstore.bench.connector", "--help"]]
