"""The demo's parts: the "what next" commands work as printed, the picture is a PNG, and the
progress bars leave sys.stdout and sys.stderr alone (on a terminal rich would take them over, and
vLLM's logger, configured meanwhile, would write through the bars instead of into the log)."""

from __future__ import annotations

import io
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import typer.main
from rich.console import Console

from kvstore.cli import app
from kvstore.demo.progress import DemoProgress
from kvstore.demo.report import next_steps
from kvstore.metrics import METRIC_NAMES

from .helpers import build_store, run

_GRAFANA = Path(__file__).resolve().parents[2] / "grafana"


def _commands(directory: Path) -> list[list[str]]:
    return [shlex.split(command) for step in next_steps(directory) for command in step.commands]


def test_the_store_commands_run_on_the_demo_directory(tmp_path: Path) -> None:
    directory = tmp_path / "a dir"  # a space: the commands quote their paths
    directory.mkdir()
    build_store(directory / "store")
    store_commands = [c for c in _commands(directory) if c[1] in {"stat", "ls", "verify"}]

    assert [c[1] for c in store_commands] == ["stat", "ls", "verify"]
    for command in store_commands:
        result = run(*command[1:])
        assert result.exit_code == 0, (command, result.stderr)


def test_every_kvstore_command_parses(tmp_path: Path) -> None:
    group = typer.main.get_command(app)
    assert isinstance(group, typer.core.TyperGroup)
    kvstore_commands = [c for c in _commands(tmp_path) if c[0] == "kvstore"]

    assert {c[1] for c in kvstore_commands} == {"stat", "ls", "verify", "demo", "serve", "bench"}
    for command in kvstore_commands:
        group.commands[command[1]].make_context(command[1], command[2:])  # raises if it cannot


def test_the_metrics_commands_name_what_exists(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(_GRAFANA.parent)  # where `make demo` runs
    commands = _commands(tmp_path)
    (demo,) = [c for c in commands if c[:2] == ["kvstore", "demo"]]
    (watch,) = [c for c in commands if c[0] == "watch"]
    (prometheus,) = [c for c in commands if c[0] == "prometheus"]

    assert demo[-2:] == ["--metrics-port", "9400"]
    assert "127.0.0.1:9400/metrics" in watch[-1]
    assert watch[-1].split("grep ^")[1] in METRIC_NAMES
    config = Path(prometheus[1].removeprefix("--config.file="))
    assert config.is_file()
    assert "localhost:9400" in config.read_text()
    assert "localhost:9401" in config.read_text()  # `kvstore serve ... --port 9401`


@dataclass(frozen=True)
class _Turn:
    turn: int
    engine_cache_tokens: int = 100
    cpu_tokens: int = 50
    disk_tokens: int = 10
    computed_tokens: int = 40


def test_the_picture_is_a_png(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from kvstore.demo.picture import draw_turns

    path = draw_turns([_Turn(t) for t in range(3)], tmp_path / "sub" / "demo.png")  # type: ignore[arg-type]

    assert path.read_bytes().startswith(b"\x89PNG")


@dataclass(frozen=True)
class _Stats:
    turn: int
    num_requests: int = 3
    engine_cache_tokens: int = 1000
    cpu_tokens: int = 200
    disk_tokens: int = 32
    computed_tokens: int = 1500


def test_progress_on_a_terminal_leaves_the_std_streams_alone() -> None:
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=100)
    streams = (sys.stdout, sys.stderr)

    with DemoProgress(console, num_requests=6, num_turns=2, has_reference=True) as progress:
        assert (sys.stdout, sys.stderr) == streams
        progress.message("engine started")
        for turn in range(2):
            progress.turn(_Stats(turn))  # type: ignore[arg-type]

    assert "engine started" in out.getvalue()
    assert "6/6 requests, turn 2/2" in out.getvalue()
    assert "engine cache 2,000 · kvstore CPU 400 · disk 64 · computed 3,000" in out.getvalue()
