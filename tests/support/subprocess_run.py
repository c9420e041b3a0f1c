"""Run `tests.support.driver` in a child process and parse its result line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

__all__ = ["run_engine_here", "run_engine_process"]


def run_engine_process(spec: dict[str, Any], timeout_s: float = 300.0) -> dict[str, Any]:
    env = dict(os.environ)
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.update(spec.get("env", {}))
    # `tests.support.driver` lives in the source tree, not in the installed package.
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
    proc = subprocess.run(
        [sys.executable, "-m", "tests.support.driver", json.dumps(spec)],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        env=env,
        check=False,
    )
    for line in proc.stdout.splitlines():
        if line.startswith("KVSTORE-RESULT "):
            result: dict[str, Any] = json.loads(line.removeprefix("KVSTORE-RESULT "))
            result["returncode"] = proc.returncode
            result["stderr_tail"] = proc.stderr[-4000:]
            return result
    raise RuntimeError(
        f"engine process exited {proc.returncode} without a result:\n{proc.stderr[-6000:]}"
    )


def run_engine_here(spec: dict[str, Any]) -> dict[str, Any]:
    """The same run in this process, where vLLM is already imported: for a test's first
    engine, whose store or Redis a fresh process (`run_engine_process`) then meets. A fresh
    process costs its imports of vLLM (~20 s on a 2-vCPU EPYC without AVX-512)."""
    from tests.support.driver import run

    if spec.get("env") or spec.get("multiprocess"):
        raise ValueError("an in-process run takes no env and no multiprocess engine")
    result = run(spec)
    result.update(returncode=0, stderr_tail="")
    return result
