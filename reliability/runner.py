"""Runs scenarios, each in its own child process under its time limit, and collects the rows.

`run_one(name, ...)` is what the child does (`python -m reliability --worker NAME`): run the
scenario in-process and write its row as JSON. `run_all(...)` starts one child per scenario,
waits at most the scenario's timeout, and turns a timeout, a signal or a missing row into a
failed row that says so; a scenario never takes the run down with it.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Sequence
from pathlib import Path

from reliability.registry import SCENARIOS, Row, RunContext, Scenario

__all__ = ["run_all", "run_one", "select"]

_ROOT = Path(__file__).resolve().parent.parent


def select(names: Sequence[str]) -> list[Scenario]:
    """The scenarios named (all when none), by issue number; ValueError for an unknown one."""
    import reliability.scenarios  # noqa: F401  (registers them)

    unknown = sorted(set(names) - set(SCENARIOS))
    if unknown:
        raise ValueError(f"unknown scenario(s) {unknown}; known: {sorted(SCENARIOS)}")
    chosen = [spec for name, spec in SCENARIOS.items() if not names or name in names]
    return sorted(chosen, key=lambda spec: spec.number)


def run_one(name: str, *, is_smoke: bool, seed: int, out: Path) -> int:
    """Run scenario `name` here and write its row to `out` (exit status 0, or 1 if it raised:
    the row then says what was raised)."""
    (spec,) = select([name])
    start = time.monotonic()
    workdir = Path(tempfile.mkdtemp(prefix=f"kvstore-reliability-{name}-"))
    try:
        outcome = spec.run(RunContext(is_smoke=is_smoke, workdir=workdir, seed=seed))
        row = spec.row(outcome, is_smoke=is_smoke, duration_s=time.monotonic() - start)
        status = 0
    except Exception as exc:
        why = "raised " + "".join(traceback.format_exception_only(type(exc), exc)).strip()
        traceback.print_exc()
        row = Row.failed(spec, is_smoke=is_smoke, duration_s=time.monotonic() - start, why=why)
        status = 1
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    out.write_text(json.dumps(row.to_json(), indent=2))
    return status


def run_all(
    scenarios: Sequence[Scenario], *, is_smoke: bool, seed: int, log_dir: Path
) -> list[Row]:
    """One child per scenario; a row each, failed where the child did not deliver one."""
    log_dir.mkdir(parents=True, exist_ok=True)
    rows = []
    for spec in scenarios:
        timeout_s = spec.smoke_timeout_s if is_smoke else spec.timeout_s
        print(
            f"reliability: {spec.name} (limit {timeout_s:.0f} s) ...", file=sys.stderr, flush=True
        )
        row = _run_child(spec, is_smoke=is_smoke, seed=seed, timeout_s=timeout_s, log_dir=log_dir)
        print(
            f"reliability: {spec.name}: {row.result} in {row.duration_s:.0f} s"
            + "".join(f"\n    {line}" for line in row.found[:10]),
            file=sys.stderr,
            flush=True,
        )
        rows.append(row)
    return rows


def _run_child(
    spec: Scenario, *, is_smoke: bool, seed: int, timeout_s: float, log_dir: Path
) -> Row:
    out = log_dir / f"{spec.name}.json"
    out.unlink(missing_ok=True)
    command = [sys.executable, "-m", "reliability", "--worker", spec.name, "--seed", str(seed),
               "--row-out", str(out), *(["--smoke"] if is_smoke else [])]  # fmt: skip
    start = time.monotonic()
    with (log_dir / f"{spec.name}.log").open("w") as log:
        child = subprocess.Popen(
            command, cwd=_ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            child.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()
            why = f"timed out after {timeout_s:.0f} s (killed); see {log.name}"
            return Row.failed(spec, is_smoke=is_smoke, duration_s=timeout_s, why=why)
    duration_s = time.monotonic() - start
    if out.is_file():
        return Row.from_json(json.loads(out.read_text()))
    code = child.returncode
    how = f"killed by {signal.Signals(-code).name}" if code < 0 else f"exited {code}"
    why = f"the scenario process {how} without a row; see {log_dir / (spec.name + '.log')}"
    return Row.failed(spec, is_smoke=is_smoke, duration_s=duration_s, why=why)
