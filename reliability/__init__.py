"""kvstore's reliability suite (issue 13): break the store on purpose, count, publish the figures.

    python -m reliability            every registered scenario, full trial counts; writes
                                     RELIABILITY.md and .reliability/rows.json
    python -m reliability --smoke    tiny trial counts (CI); writes .reliability/smoke.md

Each scenario runs in its own child process under a time limit, so a hang, a crash or a signal
(SIGBUS from a truncated map, say) becomes a failed row instead of killing the run. A scenario
returns an `Outcome`; the runner adds its name, pass rule and duration to make a `Row`, and
`RELIABILITY.md` is rendered from the rows (no number in it is typed by hand).

Adding a scenario (the engine ones: kill -9 storms, bit rot, live operations, soak): write a
module under `reliability/scenarios/` with one function decorated by `registry.scenario(...)`
that takes a `RunContext` and returns an `Outcome`, and import it in
`reliability/scenarios/__init__.py`. See `registry.py`.

The same fault machinery (`fuzz`, `targets`, `damage`, `fs`, `exposure`) backs the pytest tests in
`tests/reliability/`, so a regression fails `pytest tests/reliability` before it reaches a run.
"""

from __future__ import annotations

from reliability.registry import SCENARIOS, Outcome, Row, RunContext, Scenario, scenario

__all__ = ["SCENARIOS", "Outcome", "Row", "RunContext", "Scenario", "scenario"]
