"""The scenario registry: what a scenario declares, what it returns, and the row it becomes.

A scenario is a function `run(ctx: RunContext) -> Outcome`, registered with its issue number, a
title, the pass rule (one sentence a reader can check against the numbers) and time limits:

    @scenario(
        "kill-storm", number=1, title="kill -9 storms",
        pass_rule="verify exits 0 after every kill; 0 chunks lost; 0 bad tokens",
        timeout_s=900, smoke_timeout_s=120, needs=("engine",),
    )
    def kill_storm(ctx: RunContext) -> Outcome:
        trials = 3 if ctx.is_smoke else 30
        ...
        return Outcome(trials=trials, faults_injected=..., requests_served=...,
                       chunks_lost=..., bad_tokens_served=..., passed=..., found=[...])

`Outcome.requests_served`, `chunks_lost` and `bad_tokens_served` stay None for a scenario that
runs no engine (the table shows "n/a"). `found` holds one line per problem the run saw (a crash,
a lost chunk); `details` holds any further figures (they land in rows.json). `passed` is the
scenario's own verdict of its pass rule; the runner also fails a row that timed out or crashed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "ISSUE_SCENARIOS",
    "SCENARIOS",
    "Outcome",
    "Row",
    "RunContext",
    "Scenario",
    "scenario",
]

ISSUE_SCENARIOS: dict[int, str] = {
    1: "kill -9 storms",
    2: "bit rot",
    3: "disk full and failing disk",
    4: "hostile inputs",
    5: "live operations",
    6: "soak (bounded)",
    7: "exposure",
}
"""The scenarios issue 13 asks for, by number (the report lists those not registered yet)."""


@dataclass(frozen=True, slots=True)
class RunContext:
    """What a scenario is given: the mode, a private scratch directory and a seed."""

    is_smoke: bool
    workdir: Path
    seed: int

    def trials(self, smoke: int, full: int) -> int:
        return smoke if self.is_smoke else full


@dataclass(slots=True)
class Outcome:
    """What one scenario run measured (see the module docstring)."""

    trials: int
    faults_injected: int
    passed: bool
    requests_served: int | None = None
    chunks_lost: int | None = None
    bad_tokens_served: int | None = None
    found: list[str] = field(default_factory=list)
    details: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Row:
    """One line of RELIABILITY.md (and of rows.json)."""

    scenario: str
    number: int
    title: str
    pass_rule: str
    is_smoke: bool
    trials: int
    faults_injected: int
    requests_served: int | None
    chunks_lost: int | None
    bad_tokens_served: int | None
    passed: bool
    duration_s: float
    found: tuple[str, ...] = ()
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def result(self) -> str:
        return "pass" if self.passed else "FAIL"

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["found"] = list(self.found)
        data["result"] = self.result
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Row:
        fields = {name: data[name] for name in cls.__dataclass_fields__ if name in data}
        fields["found"] = tuple(fields.get("found", ()))
        return cls(**fields)

    @classmethod
    def failed(cls, spec: Scenario, *, is_smoke: bool, duration_s: float, why: str) -> Row:
        """The row of a scenario that did not return (timed out, crashed, raised)."""
        return cls(
            scenario=spec.name,
            number=spec.number,
            title=spec.title,
            pass_rule=spec.pass_rule,
            is_smoke=is_smoke,
            trials=0,
            faults_injected=0,
            requests_served=None,
            chunks_lost=None,
            bad_tokens_served=None,
            passed=False,
            duration_s=duration_s,
            found=(why,),
        )


@dataclass(frozen=True, slots=True)
class Scenario:
    """A registered scenario (see `scenario`)."""

    name: str
    number: int
    title: str
    pass_rule: str
    run: Callable[[RunContext], Outcome]
    timeout_s: float
    smoke_timeout_s: float
    needs: tuple[str, ...] = ()
    history: tuple[str, ...] = ()

    def row(self, outcome: Outcome, *, is_smoke: bool, duration_s: float) -> Row:
        return Row(
            scenario=self.name,
            number=self.number,
            title=self.title,
            pass_rule=self.pass_rule,
            is_smoke=is_smoke,
            trials=outcome.trials,
            faults_injected=outcome.faults_injected,
            requests_served=outcome.requests_served,
            chunks_lost=outcome.chunks_lost,
            bad_tokens_served=outcome.bad_tokens_served,
            passed=outcome.passed,
            duration_s=round(duration_s, 1),
            found=tuple(outcome.found),
            details=outcome.details,
        )


SCENARIOS: dict[str, Scenario] = {}
"""Every registered scenario by name, in registration (= report) order."""


def scenario(
    name: str,
    *,
    number: int,
    title: str,
    pass_rule: str,
    timeout_s: float,
    smoke_timeout_s: float,
    needs: tuple[str, ...] = (),
    history: tuple[str, ...] = (),
) -> Callable[[Callable[[RunContext], Outcome]], Callable[[RunContext], Outcome]]:
    """Register `run` as scenario `name` (issue 13's scenario `number`).

    `needs` names what the scenario requires ("engine", "root", "mount"); `history` lists, one
    line each, what earlier runs of it found and how that was fixed (the report prints them).
    """
    if number not in ISSUE_SCENARIOS:
        raise ValueError(f"scenario number {number} is not one of issue 13's {ISSUE_SCENARIOS}")

    def register(run: Callable[[RunContext], Outcome]) -> Callable[[RunContext], Outcome]:
        if name in SCENARIOS:
            raise ValueError(f"scenario {name!r} is registered twice")
        SCENARIOS[name] = Scenario(
            name, number, title, pass_rule, run, timeout_s, smoke_timeout_s, needs, history
        )
        return run

    return register
