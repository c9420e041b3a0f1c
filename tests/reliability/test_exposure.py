"""Scenario 7, exposure: one test per check of `reliability.exposure`, plus the CLI's own."""

from __future__ import annotations

import socket
from collections.abc import Callable
from pathlib import Path

import pytest

from reliability import exposure
from reliability.checks import check_cli, run_cli
from reliability.damage import small_store


@pytest.mark.parametrize(
    "check",
    [
        exposure.config_defaults_expose_nothing,
        exposure.metrics_server_defaults_to_loopback,
        exposure.serve_defaults_to_loopback,
        exposure.zmq_sink_listens_only_where_told,
        exposure.watch_connects_without_listening,
        exposure.region_file_is_private,
        exposure.metrics_port_in_use_fails_fast,
        exposure.no_format_runs_code,
    ],
    ids=lambda c: c.__name__,
)
def test_exposure_check(check: Callable[[], exposure.Check]) -> None:
    result = check()
    assert result.passed, f"{result.name}: {result.detail}"


def test_store_directory_and_files_are_private() -> None:
    """0700/0600 under umask 0, also when the store is made in an existing empty directory."""
    result = exposure.store_files_are_private()
    assert result.passed, result.detail


def test_an_events_endpoint_in_use_fails_naming_its_key() -> None:
    result = exposure.events_endpoint_in_use_names_key()
    assert result.passed, result.detail


def test_serve_on_a_port_in_use_names_the_option() -> None:
    with small_store(2, 64) as path, socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = run_cli("serve", path, "--port", port, "--duration-s", "0")
    check_cli(result, "serve")
    assert result.exit_code == 1
    assert f"cannot listen on 127.0.0.1:{port} (--host/--port)" in result.stderr


def test_the_code_execution_finder_can_fail_for_the_right_reason(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "m.py").write_text(
        "import pickle, torch, yaml\n"
        "pickle.loads(b'')\ntorch.load('x')\nyaml.load('')\neval('1')\nprint('ok')\n"
    )
    found = exposure.code_execution_calls((package,))
    assert [line.split(" ", 1)[1] for line in found] == [
        "pickle.loads", "torch.load", "yaml.load", "eval"
    ]  # fmt: skip


# -- the engine runtime, built without an engine ---------------------------------------------------


def _runtime_check(key: str) -> exposure.Check:
    pytest.importorskip("vllm")
    checks = {c.name: c for c in exposure.runtime_ports_in_use_name_keys()}
    return checks[f"engine start names {key} when in use"]


def test_engine_start_names_events_endpoint_when_in_use() -> None:
    result = _runtime_check("events_endpoint")
    assert result.passed, result.detail


def test_engine_start_names_metrics_port_when_in_use() -> None:
    result = _runtime_check("metrics_port")
    assert result.passed, result.detail
