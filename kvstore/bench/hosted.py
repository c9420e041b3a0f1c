"""An in-process engine in a process of its own, driven from the benchmark's process.

    python -m kvstore.bench.hosted SPEC_JSON

The in-process layout (`VLLM_ENABLE_V1_MULTIPROCESSING=0`: scheduler, model runner and kvstore's
threads all in the caller's process, the shape of vLLM's uniproc executor on one GPU) cannot
host two engines in one process, and an engine measured beside another's threads would not be
measured alone. So each in-process engine of a benchmark gets a host process: it starts the
engine from `SPEC_JSON` (the keyword arguments of `bench_engine`), prints one JSON line
`{"metrics_url": ...}` when ready, then answers one JSON line per request line:

- `{"op": "generate", "prompts": [[token ids]...], "max_tokens": N}` -> `{"seconds": s}`, timed
  inside the host (what an in-process caller of `LLM.generate` waits);
- `{"op": "reset_prefix_cache"}` -> `{"ok": bool}`.

End of input shuts the engine down. vLLM logs on stdout too: answers are the lines that start
with `{`.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kvstore.bench.child import JsonLineChild

__all__ = ["HostedLLM", "main"]


class HostedLLM:
    """The benchmark's side of a host process: what `BenchEngine` needs of an engine."""

    def __init__(self, spec: dict[str, Any]) -> None:
        self._child = JsonLineChild([sys.executable, "-m", __name__, json.dumps(spec)])
        self.metrics_url: str | None = self._child.answer()["metrics_url"]

    @property
    def pid(self) -> int:
        return self._child.process.pid

    def generate_s(self, prompts: Sequence[Sequence[int]], max_tokens: int) -> float:
        request = {"op": "generate", "prompts": [list(p) for p in prompts]}
        return float(self._child.ask(request | {"max_tokens": max_tokens})["seconds"])

    def reset_prefix_cache(self) -> bool:
        return bool(self._child.ask({"op": "reset_prefix_cache"})["ok"])

    def close(self) -> None:
        self._child.close()


def _serve(llm: Any) -> None:
    from kvstore.vllm.engine import generate_greedy, reset_prefix_cache

    for line in sys.stdin:
        request = json.loads(line)
        answer: dict[str, Any]
        if request["op"] == "generate":
            start = time.perf_counter()
            generate_greedy(llm, request["prompts"], max_tokens=int(request["max_tokens"]))
            answer = {"seconds": time.perf_counter() - start}
        elif request["op"] == "reset_prefix_cache":
            answer = {"ok": reset_prefix_cache(llm)}
        else:
            answer = {"error": f"unknown op {request['op']!r}"}
        print(json.dumps(answer), flush=True)


def main(argv: Sequence[str]) -> int:
    from kvstore.bench.engines import bench_engine

    spec = json.loads(argv[1])
    model, num_tokens = Path(spec.pop("model")), int(spec.pop("num_tokens"))
    with bench_engine(model, num_tokens, multiprocess=False, **spec) as engine:
        print(json.dumps({"metrics_url": engine.metrics_url}), flush=True)
        _serve(engine.llm)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
