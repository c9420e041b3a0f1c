"""Scenario 7, exposure: one test per check of `reliability.exposure`, plus the CLI's own."""

from __future__ import annotations

from reliability import exposure


def test_store_directory_and_files_are_private() -> None:
    """0700/0600 under umask 0, also when the store is made in an existing empty directory."""
    result = exposure.store_files_are_private()
    assert result.passed, result.detail
