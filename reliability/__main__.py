"""`python -m reliability [--smoke] [--only NAME]...`: run the scenarios, write the report.

Full runs write `RELIABILITY.md` at the top level; smoke runs write `.reliability/smoke.md`, so
the published figures are always those of the last full run. Rows go to
`.reliability/rows.json` (or `smoke-rows.json`), each scenario's log to `.reliability/logs/`.
Exit status: 0 when every scenario passed, 1 otherwise, 2 for bad arguments.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

from reliability.report import render
from reliability.runner import run_all, run_one, select

_ROOT = Path(__file__).resolve().parent.parent
_STATE = _ROOT / ".reliability"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m reliability", description=__doc__)
    parser.add_argument("--smoke", action="store_true", help="tiny trial counts (CI)")
    parser.add_argument("--only", action="append", default=[], metavar="NAME",
                        help="run only this scenario (repeatable)")  # fmt: skip
    parser.add_argument("--list", action="store_true", help="list the scenarios and exit")
    parser.add_argument("--seed", type=int, default=13)
    parser.add_argument("--report", type=Path, help="where to write the markdown report")
    parser.add_argument("--worker", metavar="NAME", help=argparse.SUPPRESS)
    parser.add_argument("--row-out", type=Path, help=argparse.SUPPRESS)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.worker:
        return run_one(args.worker, is_smoke=args.smoke, seed=args.seed, out=args.row_out)
    try:
        scenarios = select(args.only)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.list:
        for spec in scenarios:
            print(f"{spec.name:16} {spec.number}. {spec.title}")
        return 0
    prefix = "smoke-" if args.smoke else ""
    rows = run_all(scenarios, is_smoke=args.smoke, seed=args.seed, log_dir=_STATE / "logs")
    _STATE.mkdir(exist_ok=True)
    (_STATE / f"{prefix}rows.json").write_text(
        json.dumps([row.to_json() for row in rows], indent=2) + "\n"
    )
    report = args.report or (_STATE / "smoke.md" if args.smoke else _ROOT / "RELIABILITY.md")
    command = shlex.join(["python", "-m", "reliability", *(argv or sys.argv[1:])])
    report.write_text(render(rows, command=command, seed=args.seed))
    print(f"reliability: wrote {report}", file=sys.stderr)
    return 0 if all(row.passed for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
