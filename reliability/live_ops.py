"""Operators' commands in a loop against a live store: `python -m reliability.live_ops STORE
SECONDS SEED`, a process of its own next to the engine (scenario 5).

Until SECONDS have passed it runs, at random: `kvstore rm` of one to three chunks picked from
`kvstore ls --json`, now and then `kvstore rm --all`, `kvstore gc --max-bytes` a random
fraction of what `kvstore stat --json` says is used, and `kvstore verify --repair --json`.
Each command runs in this process (`reliability.checks.run_cli`) and is held to the CLI's
promise (`check_cli`): exit 0, or 1 with one `error:` line, never a traceback. Verify must find
nothing corrupt: removing chunks never damages others. Prints one JSON document at the end:
the commands run, what they removed, and every failure.
"""

from __future__ import annotations

import json
import random
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from reliability.checks import Crash, check_cli, run_cli

__all__ = ["LiveOpsReport", "run"]

_WEIGHTS = {"rm": 4, "rm-all": 0.3, "gc": 2, "verify-repair": 2}


@dataclass(slots=True)
class LiveOpsReport:
    num_commands: dict[str, int] = field(default_factory=dict)
    num_removed: dict[str, int] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)

    def count(self, op: str, removed: int) -> None:
        self.num_commands[op] = self.num_commands.get(op, 0) + 1
        self.num_removed[op] = self.num_removed.get(op, 0) + removed


def _json(store: Path, *args: str) -> dict[str, Any]:
    """`kvstore ARGS... STORE --json`, checked; its document ({} on exit 1)."""
    result = run_cli(*args[:1], store, *args[1:], "--json")
    check_cli(result, args[0])
    if result.exit_code != 0:
        raise Crash(f"kvstore {' '.join(args)} exited {result.exit_code}: "
                    f"{result.stderr.strip()[-200:]}")  # fmt: skip
    document: dict[str, Any] = json.loads(result.stdout)
    return document


def _one(store: Path, op: str, rng: random.Random) -> int:
    """Run one command; the number of chunks it removed."""
    if op == "rm":
        chunks = _json(store, "ls")["chunks"]
        if not chunks:
            return 0
        picked = rng.sample(chunks, min(len(chunks), rng.randint(1, 3)))
        return int(_json(store, "rm", *(c["key"] for c in picked), "--yes")["num_deleted"])
    if op == "rm-all":
        return int(_json(store, "rm", "--all", "--yes")["num_deleted"])
    if op == "gc":
        used = int(_json(store, "stat")["used_bytes"])
        target = int(used * rng.uniform(0.3, 0.9))
        return int(_json(store, "gc", "--max-bytes", str(target), "--yes")["num_evicted"])
    report = _json(store, "verify", "--repair")
    if report["num_corrupt"]:
        raise Crash(f"verify found {report['num_corrupt']} corrupt chunks on a store that was "
                    f"only ever rm'ed and gc'ed: {report['corrupt'][:3]}")  # fmt: skip
    return int(report["num_repaired"])


def run(store: Path, seconds: float, seed: int) -> LiveOpsReport:
    rng = random.Random(seed)
    report = LiveOpsReport()
    ops, weights = list(_WEIGHTS), list(_WEIGHTS.values())
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        op = rng.choices(ops, weights)[0]
        try:
            report.count(op, _one(store, op, rng))
        except Crash as exc:
            report.count(op, 0)
            if len(report.failures) < 20:
                report.failures.append(f"{op}: {exc}")
        time.sleep(rng.uniform(0.0, 0.4))
    return report


def main() -> None:
    store, seconds, seed = Path(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])
    print(json.dumps(asdict(run(store, seconds, seed))), flush=True)


if __name__ == "__main__":
    main()
