"""Scenario 7, exposure: one test per check of `reliability.exposure`, plus the CLI's own."""

from __future__ import annotations

import socket

from reliability import exposure
from reliability.checks import check_cli, run_cli
from reliability.damage import small_store


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
