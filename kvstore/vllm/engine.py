"""Start a real vLLM engine (the CPU one here) on the tiny local Llama, in this process.

Single-process mode (`VLLM_ENABLE_V1_MULTIPROCESSING=0`) unless asked otherwise; prompts are token
ids because the tiny model has no tokenizer.
"""

from __future__ import annotations

import gc
import json
import os
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from kvstore.oracle import GreedyRun
from kvstore.tiny_model import TinyLlamaSpec

__all__ = [
    "KVSTORE_CONNECTOR",
    "drain",
    "engine",
    "generate_greedy",
    "generate_outputs",
    "generate_runs",
    "greedy_runs",
    "kv_transfer_config",
    "reset_prefix_cache",
    "scheduler_connector",
]

KVSTORE_CONNECTOR = "KVStoreConnector"


def kv_transfer_config(**extra: Any) -> dict[str, Any]:
    """The `--kv-transfer-config` a user passes to enable kvstore, as a dict."""
    return {
        "kv_connector": KVSTORE_CONNECTOR,
        "kv_connector_module_path": "kvstore.vllm",
        "kv_role": "kv_both",
        "kv_connector_extra_config": extra,
    }


@contextmanager
def engine(
    model_dir: Path,
    *,
    kv_transfer: dict[str, Any] | None = None,
    kv_cache_bytes: int = 64 << 20,
    block_size: int = 32,
    max_model_len: int = 2048,
    multiprocess: bool = False,
    **llm_kwargs: Any,
) -> Iterator[Any]:
    """Yield a `vllm.LLM` on the tiny model; shut it down (connector included) on exit."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1" if multiprocess else "0"
    from vllm import LLM
    from vllm.config import KVTransferConfig

    kwargs: dict[str, Any] = {
        "model": str(model_dir),
        "skip_tokenizer_init": True,
        "dtype": TinyLlamaSpec().dtype,
        "max_model_len": max_model_len,
        "enforce_eager": True,
        "kv_cache_memory_bytes": kv_cache_bytes,
        "block_size": block_size,
        "enable_prefix_caching": True,
        "seed": 0,
    }
    if kv_transfer is not None:
        kwargs["kv_transfer_config"] = KVTransferConfig(**json.loads(json.dumps(kv_transfer)))
    kwargs.update(llm_kwargs)
    try:
        llm = LLM(**kwargs)
    except BaseException:
        # A failed start leaves vLLM's process-global worker connector behind (the engine never
        # got to shut it down), and the next engine in this process would reuse it.
        from vllm.distributed.kv_transfer.kv_transfer_state import ensure_kv_transfer_shutdown

        ensure_kv_transfer_shutdown()
        raise
    try:
        yield llm
    finally:
        shutdown = getattr(llm.llm_engine.engine_core, "shutdown", None)
        if shutdown is not None:
            shutdown()
        del llm
        gc.collect()


def generate_greedy(
    llm: Any, prompts: Sequence[Sequence[int]], max_tokens: int = 8
) -> list[list[int]]:
    """Greedy-decode each token-id prompt; return the generated token ids per prompt."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    outputs = llm.generate(
        [TokensPrompt(prompt_token_ids=list(p)) for p in prompts], params, use_tqdm=False
    )
    return [list(o.outputs[0].token_ids) for o in outputs]


def scheduler_connector(llm: Any) -> Any:
    """The scheduler-side connector of an in-process (single-process mode) engine."""
    core = llm.llm_engine.engine_core
    engine_core = getattr(core, "engine_core", core)
    return engine_core.scheduler.connector


def generate_outputs(llm: Any, prompts: Sequence[Sequence[int]], max_tokens: int = 8) -> list[Any]:
    """Like `generate_greedy` but returns vLLM's RequestOutputs (num_cached_tokens etc.)."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    return list(
        llm.generate(
            [TokensPrompt(prompt_token_ids=list(p)) for p in prompts], params, use_tqdm=False
        )
    )


def generate_runs(
    llm: Any, prompts: Sequence[Sequence[int]], max_tokens: int = 8
) -> tuple[list[Any], list[GreedyRun]]:
    """Greedy-decode with the top-2 logprobs of every step: vLLM's RequestOutputs and the
    `kvstore.oracle.GreedyRun`s that the tie-aware comparison needs."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True, logprobs=2)
    outputs = list(
        llm.generate(
            [TokensPrompt(prompt_token_ids=list(p)) for p in prompts], params, use_tqdm=False
        )
    )
    return outputs, greedy_runs(outputs)


def greedy_runs(outputs: Sequence[Any]) -> list[GreedyRun]:
    """`GreedyRun`s of RequestOutputs generated with `logprobs >= 2`."""
    runs = []
    for output in outputs:
        completion = output.outputs[0]
        gaps = []
        for step in completion.logprobs or ():
            top = sorted((lp.logprob for lp in step.values()), reverse=True)
            gaps.append(top[0] - top[1] if len(top) > 1 else float("inf"))
        runs.append(GreedyRun(tuple(completion.token_ids), tuple(gaps)))
    return runs


def reset_prefix_cache(llm: Any, timeout_s: float = 10.0) -> bool:
    """vLLM resets only while no block is in use. An engine with a connector that stores
    asynchronously keeps a finished request's blocks until the workers report its stores done,
    which they do at a later step; `LLM.generate` returned without taking one, so take those
    steps here, as a serving loop would."""
    deadline = time.monotonic() + timeout_s
    while not llm.reset_prefix_cache():
        if time.monotonic() > deadline:
            return False
        llm.llm_engine.step()
        time.sleep(0.005)
    return True


def drain(llm: Any, timeout_s: float = 30.0) -> None:
    """Step an in-process engine until kvstore has no copy job, promotion or disk write in
    flight and no finished request waits for vLLM to release its blocks, then apply their
    results (the store is then complete and the index settled)."""
    connector = scheduler_connector(llm)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        runtime = connector.runtime
        service = runtime.service if runtime is not None else None
        scheduler = connector.scheduler
        busy = scheduler.has_pending_work() or scheduler.has_unreleased_requests()
        busy = busy or (service is not None and not service.wait_idle(0))
        if not busy:
            connector.scheduler.settle()
            return
        llm.llm_engine.step()
        time.sleep(0.005)
    raise TimeoutError(f"kvstore still busy after {timeout_s}s")
