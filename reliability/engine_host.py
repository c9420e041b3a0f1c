"""The engine child of the engine scenarios: `python -m reliability.engine_host`.

It imports vLLM and torch once (most of an engine's start on this machine: ~8 s of ~10 s), says
`{"op": "ready"}`, then obeys one JSON command per line on stdin and answers each with one
JSON line on its protocol stream (the original stdout; vLLM's own output goes to stderr):

    {"op": "model", "dir": D}                     build the tiny model in D (once)
    {"op": "engine", "model": D, "extra": {...}}  start an engine: kvstore with that
                                                  kv_connector_extra_config, or none for null
    {"op": "generate", "prompts": [[...]], "max_tokens": 8, "reset": true}
                                                  greedy with top-2 logprobs; `reset` drops
                                                  vLLM's prefix cache first, so repeated
                                                  prefixes come from kvstore, not the engine
    {"op": "summary"}                             drain kvstore, its counters and in-flight
                                                  counts (pins, holds, jobs, tracked requests)
    {"op": "close"}                               shut the engine down (kvstore included)
    {"op": "exit"}

An answer holds `"ok": true` and the op's figures, or `"ok": false, "error": "..."`. The
parent (`reliability.engines.EngineHost`) can start the next child while the current one
serves, so the import overlaps, and SIGKILL a child at any moment (scenario 1).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import IO, Any

__all__ = ["main"]

_OPS = frozenset({"model", "engine", "generate", "summary", "close"})


class _Host:
    def __init__(self, out: IO[str]) -> None:
        self.out = out
        self.stack = contextlib.ExitStack()
        self.llm: Any = None
        self.has_kvstore = False

    def answer(self, payload: dict[str, Any]) -> None:
        self.out.write(json.dumps(payload) + "\n")
        self.out.flush()

    def model(self, command: dict[str, Any]) -> dict[str, Any]:
        from kvstore.tiny_model import build_tiny_llama

        return {"dir": str(build_tiny_llama(Path(command["dir"])))}

    def engine(self, command: dict[str, Any]) -> dict[str, Any]:
        from kvstore.vllm.engine import engine, kv_transfer_config

        self.close({})
        extra = command.get("extra")
        transfer = None if extra is None else kv_transfer_config(**extra)
        start = time.monotonic()
        kwargs = dict(command.get("llm_kwargs", {}))
        self.llm = self.stack.enter_context(
            engine(Path(command["model"]), kv_transfer=transfer, **kwargs)
        )
        self.has_kvstore = transfer is not None
        return {"start_s": round(time.monotonic() - start, 3), "pid": os.getpid()}

    def generate(self, command: dict[str, Any]) -> dict[str, Any]:
        from kvstore.vllm.engine import generate_runs

        if command.get("reset", True):
            self.llm.reset_prefix_cache()
        start = time.monotonic()
        outputs, runs = generate_runs(
            self.llm, command["prompts"], max_tokens=int(command.get("max_tokens", 8))
        )
        return {
            "outputs": [list(run.token_ids) for run in runs],
            "top2_gaps": [list(run.top2_gaps) for run in runs],
            "num_cached_tokens": [int(o.num_cached_tokens or 0) for o in outputs],
            "duration_s": round(time.monotonic() - start, 3),
        }

    def summary(self, command: dict[str, Any]) -> dict[str, Any]:
        from kvstore.vllm.engine import scheduler_connector
        from reliability.engines import flat_samples
        from tests.support.connector import drain, kvstore_summary

        if not self.has_kvstore:
            return {}
        drain(self.llm)
        connector = scheduler_connector(self.llm)
        runtime = connector.runtime
        runtime.index.check_invariants()
        return {
            "summary": kvstore_summary(self.llm),
            "counters": flat_samples(runtime.registry.collect()),
            "inflight": connector.scheduler.inflight(),
        }

    def close(self, command: dict[str, Any]) -> dict[str, Any]:
        self.stack.close()
        self.stack = contextlib.ExitStack()
        self.llm = None
        self.has_kvstore = False
        return {}


def main() -> None:
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    out = os.fdopen(os.dup(1), "w")  # the protocol stream; fd 1 (vLLM's logs) goes to stderr
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    import torch  # noqa: F401  (the slow imports, before saying ready)
    import vllm  # noqa: F401

    import kvstore.vllm.engine  # noqa: F401

    host = _Host(out)
    host.answer({"op": "ready", "ok": True, "pid": os.getpid()})
    for line in sys.stdin:
        command = json.loads(line)
        op = command["op"]
        if op == "exit":
            break
        if op not in _OPS:
            host.answer({"op": op, "ok": False, "error": f"unknown op {op!r}"})
            continue
        try:
            result = getattr(host, op)(command)
            host.answer({"op": op, "ok": True, **result})
        except Exception as exc:
            traceback.print_exc()
            host.answer({"op": op, "ok": False, "error": f"{type(exc).__name__}: {exc}"[:2000]})
    host.close({})


if __name__ == "__main__":
    main()
