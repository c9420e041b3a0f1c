"""Run the tiny engine with kvstore in a fresh process and print one JSON result line.

    python -m tests.support.driver '{"model_dir": ..., "extra": {...}, "prompts": [[...]]}'

Used by the restart and multi-process tests: each run is a separate process, as a restarted
`vllm serve` would be.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any


def run(spec: dict[str, Any]) -> dict[str, Any]:
    from kvstore.vllm.engine import engine, generate_runs, kv_transfer_config
    from tests.support.connector import drain, kvstore_summary

    multiprocess = bool(spec.get("multiprocess", False))
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1" if multiprocess else "0"
    config = kv_transfer_config(**spec.get("extra", {}))
    llm_kwargs = dict(spec.get("llm_kwargs", {}))
    model = Path(spec["model_dir"])
    with engine(model, kv_transfer=config, multiprocess=multiprocess, **llm_kwargs) as llm:
        max_tokens = int(spec.get("max_tokens", 8))
        outputs, runs = generate_runs(llm, spec["prompts"], max_tokens=max_tokens)
        result: dict[str, Any] = {
            "outputs": [list(r.token_ids) for r in runs],
            "top2_gaps": [list(r.top2_gaps) for r in runs],
            "num_cached_tokens": [o.num_cached_tokens for o in outputs],
        }
        if spec.get("repeat_after_reset"):
            time.sleep(1.0)  # let the engine core settle the stores in the background
            llm.reset_prefix_cache()
            again, again_runs = generate_runs(llm, spec["prompts"], max_tokens=max_tokens)
            result["repeat_outputs"] = [list(r.token_ids) for r in again_runs]
            result["repeat_top2_gaps"] = [list(r.top2_gaps) for r in again_runs]
            result["repeat_num_cached_tokens"] = [o.num_cached_tokens for o in again]
        if not multiprocess:
            drain(llm)
            result["summary"] = kvstore_summary(llm)
    return result


def main() -> None:
    result = run(json.loads(sys.argv[1]))
    print("KVSTORE-RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
