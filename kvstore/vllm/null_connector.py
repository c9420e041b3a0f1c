"""A KV connector that moves nothing: the baseline engine of kvstore's benchmarks.

vLLM's CPU platform lays out an engine's cores differently when any KV connector is configured:
it reserves one core per worker for the scheduler process, and one more per worker for a
connector (`vllm/utils/ompmultiprocessing.py`). On a 2-core machine that is every core, so
vLLM gives up reserving and the worker's OpenMP team spans both cores; without a connector the
worker is bound to one core. A prefill then runs about twice as fast with *any* connector,
kvstore's or vLLM's own. Comparing kvstore against an engine with no connector would credit
kvstore with vLLM's layout; the benchmarks compare it against this connector instead, which
gets the same layout and does nothing.

    --kv-transfer-config '{"kv_connector": "NullConnector",
        "kv_connector_module_path": "kvstore.vllm.null_connector", "kv_role": "kv_both"}'
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
)

if TYPE_CHECKING:
    import torch
    from vllm.forward_context import ForwardContext
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.request import Request

__all__ = ["NULL_CONNECTOR", "NullConnector", "null_transfer_config"]

NULL_CONNECTOR = "NullConnector"


def null_transfer_config() -> dict[str, Any]:
    """The `--kv-transfer-config` of an engine with `NullConnector`, as a dict."""
    return {
        "kv_connector": NULL_CONNECTOR,
        "kv_connector_module_path": __name__,
        "kv_role": "kv_both",
    }


class NullConnector(KVConnectorBase_V1):
    """Never has a hit, never loads or saves: an engine with it computes what one without any
    connector does, on the cores vLLM gives an engine with a connector."""

    def start_load_kv(self, forward_context: ForwardContext, **kwargs: Any) -> None:
        return None

    def wait_for_layer_load(self, layer_name: str) -> None:
        return None

    def save_kv_layer(
        self, layer_name: str, kv_layer: torch.Tensor, attn_metadata: Any, **kwargs: Any
    ) -> None:
        return None

    def wait_for_save(self) -> None:
        return None

    def get_num_new_matched_tokens(
        self, request: Request, num_computed_tokens: int
    ) -> tuple[int | None, bool]:
        return 0, False

    def update_state_after_alloc(
        self, request: Request, blocks: KVCacheBlocks, num_external_tokens: int
    ) -> None:
        return None

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> KVConnectorMetadata:
        return KVConnectorMetadata()
