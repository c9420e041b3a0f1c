"""The reliability harness itself: registry, isolation, rows, the report and the runner."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from reliability.isolation import Hang, in_child, time_limit
from reliability.registry import (
    ISSUE_SCENARIOS,
    SCENARIOS,
    Outcome,
    Row,
    RunContext,
    Scenario,
    scenario,
)
from reliability.report import render
from reliability.runner import _run_child, select


def _row(name: str = "demo-row", *, number: int = 4, passed: bool = True) -> Row:
    return Row(
        scenario=name,
        number=number,
        title="a title",
        pass_rule="nothing | breaks",
        is_smoke=False,
        trials=1234,
        faults_injected=56,
        requests_served=None,
        chunks_lost=0,
        bad_tokens_served=None,
        passed=passed,
        duration_s=1.5,
        found=("a crash: ValueError",) if not passed else (),
        details={"inputs": 7},
    )


def test_a_scenario_needs_an_issue_number_and_a_unique_name() -> None:
    def run(ctx: RunContext) -> Outcome:
        return Outcome(trials=1, faults_injected=0, passed=True)

    with pytest.raises(ValueError, match="scenario number 99"):
        scenario("x", number=99, title="x", pass_rule="x", timeout_s=1, smoke_timeout_s=1)
    scenario("test-only", number=4, title="t", pass_rule="p", timeout_s=1, smoke_timeout_s=1)(run)
    try:
        with pytest.raises(ValueError, match="registered twice"):
            scenario("test-only", number=4, title="t", pass_rule="p", timeout_s=1,
                     smoke_timeout_s=1)(run)  # fmt: skip
        spec = SCENARIOS["test-only"]
        row = spec.row(spec.run(RunContext(True, Path("."), 0)), is_smoke=True, duration_s=0.04)
        assert (row.trials, row.passed, row.requests_served, row.duration_s) == (1, True, None, 0.0)
    finally:
        del SCENARIOS["test-only"]


def test_rows_round_trip_through_json() -> None:
    row = _row(passed=False)
    assert Row.from_json(row.to_json()) == row
    assert row.to_json()["result"] == "FAIL"


def test_the_report_is_rendered_from_the_rows() -> None:
    text = render([_row(), _row("other", number=7, passed=False)], command="python -m x", seed=5)
    assert "| 4. a title | 1,234 | 56 | n/a | 0 | n/a | nothing \\| breaks | **pass** |" in text
    assert "**FAIL**" in text
    assert "- a crash: ValueError" in text
    assert "1 of 2 scenarios passed" in text
    for number, title in ISSUE_SCENARIOS.items():
        assert (f"{number}. {title}" in text) == (number not in (4, 7)), number


def test_unknown_scenarios_are_refused() -> None:
    with pytest.raises(ValueError, match="unknown scenario"):
        select(["no-such-scenario"])


def test_in_child_returns_the_value() -> None:
    assert in_child(lambda: {"a": [1, 2]}, timeout_s=30).value == {"a": [1, 2]}


def test_in_child_reports_a_signal() -> None:
    result = in_child(lambda: os.kill(os.getpid(), signal.SIGBUS), timeout_s=30)
    assert (result.how, result.detail) == ("signal", "SIGBUS")


def test_in_child_reports_an_exception() -> None:
    def boom() -> None:
        raise KeyError("boom")

    result = in_child(boom, timeout_s=30)
    assert result.how == "raised"
    assert "KeyError: 'boom'" in result.detail


def test_in_child_kills_a_hang() -> None:
    start = time.monotonic()
    result = in_child(lambda: time.sleep(60), timeout_s=0.5)
    assert result.how == "timeout"
    assert time.monotonic() - start < 10


def test_time_limit_interrupts_python_code() -> None:
    with pytest.raises(Hang), time_limit(0.2):
        while True:
            pass


@pytest.mark.vllm_free  # the runner's handling of a child, whatever it imports
def test_a_scenario_process_that_dies_becomes_a_failed_row(tmp_path: Path) -> None:
    """The child cannot find the scenario (it exists only here), so it dies without a row: the
    runner must say so in a failed row instead of raising."""

    def run(ctx: RunContext) -> Outcome:
        raise AssertionError("never runs")

    ghost = Scenario("ghost", 4, "ghost", "none", run, timeout_s=120, smoke_timeout_s=120)
    row = _run_child(ghost, is_smoke=True, seed=1, timeout_s=120, log_dir=tmp_path)
    assert not row.passed
    assert "without a row" in row.found[0]
    assert (tmp_path / "ghost.log").read_text()


def test_the_registered_scenarios_are_listed_by_issue_number(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from reliability.__main__ import main

    assert [spec.number for spec in select([])] == sorted(spec.number for spec in select([]))
    names = ["kill-storm", "bit-rot", "disk-faults", "hostile-inputs", "live-ops", "soak",
             "exposure"]  # fmt: skip
    assert [spec.name for spec in select([])] == names  # every scenario of issue 13, in order
    assert main(["--list"]) == 0
    assert "hostile-inputs" in capsys.readouterr().out
