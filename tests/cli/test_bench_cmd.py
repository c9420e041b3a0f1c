from __future__ import annotations

from typer.testing import CliRunner

from kvstore.cli import app


def test_bench_rejects_unknown_suite() -> None:
    result = CliRunner().invoke(app, ["bench", "nonsense"])
    assert result.exit_code == 2


def test_bench_lists_its_suites() -> None:
    result = CliRunner().invoke(app, ["bench", "--help"])
    assert result.exit_code == 0
    for suite in ("tiers", "index", "connector"):
        assert suite in result.output
