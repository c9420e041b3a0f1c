"""vLLM's own `Scheduler` (of the release under test) driving both halves of KVStoreConnector,
with a stand-in for the model: the loop an engine runs, minus the model, in milliseconds.

The scheduler half is the real `KVStoreConnector` that vLLM's scheduler builds from the
`kv_transfer_config` (its CPU region, index and tier service included); the worker half is a
real `ConnectorWorker` with a CPU `TransferEngine` over torch tensors laid out like vLLM's CPU
KV cache. The stand-in model writes, at every token position it computes, a value derived from
the tokens up to that position (as real KV is), and before doing so checks every earlier
position of the request: whatever filled it (this step's forward, vLLM's prefix cache or a
kvstore load) must hold what computing it would have written. `Loop.num_bad_positions` counts
the positions that did not.

Only the platform's `check_and_update_config` is skipped (it configures workers: vLLM 0.34's
CPU platform demands triton-cpu, and 0.33/0.34's wheels are CUDA builds); the scheduler's
configuration is vLLM's own. On those wheels `VLLM_TARGET_DEVICE=cpu` selects the CPU platform
(`make test-vllm-versions` sets it).
"""

from __future__ import annotations

import dataclasses
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import torch
from vllm import SamplingParams
from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput
from vllm.v1.request import Request

from kvstore.vllm.engine import kv_transfer_config
from kvstore.vllm.metadata import KVStoreConnectorMetadata
from kvstore.vllm.worker import ConnectorWorker

from .vllm_objects import build

__all__ = ["BLOCK", "Loop", "kv_cache_config", "make_loop", "vllm_config"]

BLOCK = 16  # tokens per engine block (= per chunk)
LAYERS = ("model.layers.0.self_attn.attn", "model.layers.1.self_attn.attn")
NUM_KV_HEADS, HEAD_SIZE = 2, 32


def vllm_config(
    model_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    *,
    model_options: dict[str, Any] | None = None,
    **extra: Any,
) -> Any:
    """vLLM's `VllmConfig` for the tiny model with KVStoreConnector and kvstore's config
    `extra` (a 1 MiB CPU tier in `tmp_path` unless given)."""
    from vllm.config import CacheConfig, KVTransferConfig, ModelConfig, VllmConfig
    from vllm.platforms import current_platform

    if current_platform.device_type != "cpu":
        pytest.fail(f"vLLM picked platform {current_platform!r}: set VLLM_TARGET_DEVICE=cpu")
    monkeypatch.setattr(
        type(current_platform), "check_and_update_config", classmethod(lambda cls, c: None)
    )
    extra.setdefault("cpu_bytes", 1 << 20)
    extra.setdefault("region_dir", str(tmp_path / "region"))
    return VllmConfig(
        model_config=ModelConfig(
            model=str(model_dir), skip_tokenizer_init=True, dtype="float32",
            max_model_len=512, enforce_eager=True, seed=0, **(model_options or {}),
        ),
        cache_config=CacheConfig(block_size=BLOCK, enable_prefix_caching=True),
        kv_transfer_config=KVTransferConfig(**kv_transfer_config(**extra)),
    )  # fmt: skip


def kv_cache_config(num_blocks: int) -> Any:
    """The scheduler's `KVCacheConfig`: one full-attention group over `LAYERS`."""
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec

    spec = FullAttentionSpec(
        block_size=BLOCK, num_kv_heads=NUM_KV_HEADS, head_size=HEAD_SIZE, dtype=torch.float32
    )
    return KVCacheConfig(
        num_blocks=num_blocks,
        kv_cache_tensors=[],  # the scheduler side allocates nothing
        kv_cache_groups=[KVCacheGroupSpec(list(LAYERS), spec)],
    )


def make_loop(
    model_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    *,
    num_blocks: int = 64,
    defer_finalize: bool = False,
    **extra: Any,
) -> Loop:
    """A `Loop` with vLLM's scheduler over `num_blocks` engine blocks (block 0 is vLLM's null
    block) and kvstore's config `extra`."""
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.structured_output import StructuredOutputManager

    config = vllm_config(model_dir, tmp_path, monkeypatch, **extra)
    config.cache_config.num_gpu_blocks = num_blocks
    scheduler = Scheduler(
        vllm_config=config,
        kv_cache_config=kv_cache_config(num_blocks),
        structured_output_manager=StructuredOutputManager(config),
        block_size=BLOCK,
    )
    return Loop(scheduler, num_blocks, defer_finalize=defer_finalize)


def _value(token_ids: Sequence[int], position: int, layer: int) -> float:
    """What "the model" writes for the token at `position`: a function of the prefix."""
    prefix = bytes(memoryview(torch.tensor(token_ids[: position + 1], dtype=torch.int32).numpy()))
    return float((zlib.crc32(prefix) & 0xFFFFF) + (layer << 20))


class Loop:
    """Steps: schedule -> worker loads -> forward (check, then write) -> worker stores ->
    results back to the scheduler, as vLLM's engine core and model runner order them."""

    def __init__(self, scheduler: Any, num_blocks: int, *, defer_finalize: bool = False) -> None:
        self.scheduler = scheduler
        # The V2 model runner of vLLM >= 0.33 under speculative decoding collects transfer
        # results and worker metadata before `wait_for_save` (`post_forward(defer_finalize=
        # True)`, then `finalize_step` after the drafter); otherwise `wait_for_save` comes first.
        self.defer_finalize = defer_finalize
        self.connector = scheduler.connector
        runtime = self.connector.runtime
        self.kv = {
            name: torch.zeros((num_blocks, NUM_KV_HEADS, BLOCK, 2 * HEAD_SIZE)) for name in LAYERS
        }
        self.worker = ConnectorWorker(runtime.geometry, runtime.config, tp_rank=0)
        self.worker.register_kv_caches(self.kv)
        self.num_bad_positions = 0
        self.num_preemptions = 0
        self.num_resumed_as_new = 0
        self._seen: set[str] = set()

    def add(self, req_id: str, token_ids: Sequence[int], max_tokens: int) -> Request:
        from vllm.utils.hashing import sha256
        from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash

        init_none_hash(sha256)
        request = Request(
            request_id=req_id,
            prompt_token_ids=list(token_ids),
            sampling_params=SamplingParams(max_tokens=max_tokens, ignore_eos=True),
            pooling_params=None,
            block_hasher=get_request_block_hasher(BLOCK, sha256),
        )
        self.scheduler.add_request(request)
        return request

    def run(self, max_steps: int = 500) -> None:
        """Step until every request has finished and kvstore has no job in flight."""
        for _ in range(max_steps):
            sched = self.scheduler
            if not (sched.has_requests() or self.connector.has_pending_push_work()):
                return
            self.step()
        raise AssertionError(f"still busy after {max_steps} steps")

    def step(self) -> None:
        out = self.scheduler.schedule()
        meta = out.kv_connector_metadata
        assert isinstance(meta, KVStoreConnectorMetadata)
        self._observe(out)
        worker = self.worker
        worker.handle_preemptions(meta)
        if out.has_sync_kv_loads:
            worker.start_load_kv(meta)  # before the forward, as the model runner does
        sampled = self._forward(out)
        if not out.has_sync_kv_loads:
            worker.start_load_kv(meta)
        if not self.defer_finalize:
            worker.wait_for_save(meta)
        finished_sending, finished_recving = worker.get_finished(set(out.finished_req_ids))
        kv_output = build(
            KVConnectorOutput,
            finished_sending=finished_sending or None,
            finished_recving=finished_recving or None,
            invalid_block_ids=worker.get_block_ids_with_load_errors(),
            kv_connector_worker_meta=worker.build_connector_worker_meta(),
        )
        if self.defer_finalize:
            worker.wait_for_save(meta)  # after the drafter: `finalize_step`
        self.scheduler.update_from_output(out, _runner_output(sampled, kv_output))

    def _observe(self, out: Any) -> None:
        self.num_preemptions += len(out.preempted_req_ids or ())
        for data in out.scheduled_new_reqs:
            if data.req_id in self._seen:
                self.num_resumed_as_new += 1  # vLLM 0.34 resends resumed requests in full
            self._seen.add(data.req_id)

    def _forward(self, out: Any) -> dict[str, list[int]]:
        sampled: dict[str, list[int]] = {}
        for req_id, num_tokens in out.num_scheduled_tokens.items():
            request = self.scheduler.requests[req_id]
            end = request.num_computed_tokens  # already advanced by schedule()
            token_ids = list(request.all_token_ids)
            blocks = self.scheduler.kv_cache_manager.get_block_ids(req_id)[0]
            self.num_bad_positions += self._check(token_ids, blocks, end - num_tokens)
            for position in range(end - num_tokens, end):
                self._write(token_ids, blocks, position)
            is_done = end >= request.num_tokens  # the step's last position yields a token
            sampled[req_id] = [sum(token_ids) % 400 + 1] if is_done else []
        return sampled

    def _check(self, token_ids: Sequence[int], blocks: Sequence[int], stop: int) -> int:
        bad = 0
        for position in range(stop):
            block, slot = blocks[position // BLOCK], position % BLOCK
            for layer, tensor in enumerate(self.kv.values()):
                if not bool(
                    (tensor[block, :, slot, :] == _value(token_ids, position, layer)).all()
                ):
                    bad += 1
        return bad

    def _write(self, token_ids: Sequence[int], blocks: Sequence[int], position: int) -> None:
        block, slot = blocks[position // BLOCK], position % BLOCK
        for layer, tensor in enumerate(self.kv.values()):
            tensor[block, :, slot, :] = _value(token_ids, position, layer)

    def hit_tokens(self) -> float:
        registry = self.connector.runtime.registry
        return sum(
            registry.get_sample_value("kvstore_hit_tokens_total", {"tier": tier}) or 0.0
            for tier in ("cpu", "disk")
        )

    def close(self) -> None:
        self.worker.shutdown()
        self.scheduler.shutdown()


def _runner_output(sampled: dict[str, list[int]], kv_output: Any) -> Any:
    """vLLM's `ModelRunnerOutput` (0.32/0.33 also index the requests: `req_id_to_index`)."""
    req_ids = list(sampled)
    values: dict[str, Any] = {
        "req_ids": req_ids,
        "sampled_token_ids": [sampled[r] for r in req_ids],
        "kv_connector_output": kv_output,
    }
    if "req_id_to_index" in {f.name for f in dataclasses.fields(ModelRunnerOutput)}:
        values["req_id_to_index"] = {req_id: i for i, req_id in enumerate(req_ids)}
    return build(ModelRunnerOutput, **values)
