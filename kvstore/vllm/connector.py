"""KVStoreConnector: vLLM's KV connector API over kvstore's tiers.

Enable it with
    --kv-transfer-config '{"kv_connector": "KVStoreConnector",
        "kv_connector_module_path": "kvstore.vllm", "kv_role": "kv_both",
        "kv_connector_extra_config": {"cpu_bytes": 4294967296,
            "disk_path": "/nvme/kvstore", "disk_bytes": 107374182400}}'

vLLM builds one instance per role: SCHEDULER in the EngineCore process (the brain: index, tier
service, LMDB, metrics, events) and WORKER in each worker process (the hands: the transfer
engine). The API is experimental upstream; kvstore supports vLLM 0.32 to 0.34 (what differs:
`kvstore.vllm.compat`).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
    SupportsHMA,
)
from vllm.distributed.kv_transfer.kv_connector.v1.metrics import (
    KVConnectorPromMetrics,
    KVConnectorStats,
    PromMetric,
    PromMetricT,
)
from vllm.v1.metrics.cache_hit_source import CacheHitSource

from kvstore.config import KVStoreConfig
from kvstore.errors import ConfigError
from kvstore.vllm.geometry import EngineGeometry
from kvstore.vllm.metadata import KVStoreConnectorMetadata
from kvstore.vllm.runtime import SchedulerRuntime
from kvstore.vllm.scheduler import ConnectorScheduler
from kvstore.vllm.startup import route_logs_to_vllm, startup_line
from kvstore.vllm.vllm_metrics import KVStoreConnectorStats, KVStorePromMetrics
from kvstore.vllm.worker import ConnectorWorker

if TYPE_CHECKING:
    from vllm.config import KVTransferConfig, VllmConfig
    from vllm.distributed.kv_events import KVCacheEvent
    from vllm.forward_context import ForwardContext
    from vllm.v1.attention.backend import AttentionMetadata
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.outputs import KVConnectorOutput
    from vllm.v1.request import Request

__all__ = ["KVStoreConnector"]

logger = logging.getLogger(__name__)

_HYBRID_WARNING = (
    "kvstore: %d of this model's %d attention layers are sliding-window or chunked-local "
    "(window %d tokens), and vLLM's hybrid KV cache manager is off in this engine (asked for "
    "with --disable-hybrid-kv-cache-manager, or by a vLLM feature that needs it off; kvstore "
    "supports it): those layers keep KV for every token, in the engine and in kvstore's tiers "
    "(kvstore_hybrid_manager_off 1; README, Limits)"
)
_HASH_WARNING = (
    "kvstore: prefix_caching_hash_algo=%s seeds its hash chain with random bytes per process, "
    "so chunk keys change on every restart and the disk tier cannot serve after one. Fix: set "
    "PYTHONHASHSEED to a fixed value for the engine, or use --prefix-caching-hash-algo sha256."
)


class KVStoreConnector(KVConnectorBase_V1, SupportsHMA):
    """Offloads prefix KV blocks to a shared CPU region and a persistent LMDB store.

    `SupportsHMA`: vLLM keeps its hybrid KV cache manager on with kvstore, so a model with
    sliding-window layers keeps its window-sized allocation; each KV cache group is stored on
    its own (`kvstore.vllm.hybrid`)."""

    _cache_hit_source = CacheHitSource.HOST

    def __init__(
        self,
        vllm_config: VllmConfig,
        role: KVConnectorRole,
        kv_cache_config: KVCacheConfig | None = None,
    ) -> None:
        route_logs_to_vllm()  # kvstore's lines and warnings appear where vLLM's do
        super().__init__(vllm_config, role, kv_cache_config)  # type: ignore[arg-type]
        if kv_cache_config is None:
            raise RuntimeError("KVStoreConnector needs vLLM >= 0.32 (kv_cache_config missing)")
        if getattr(vllm_config.model_config, "enable_sleep_mode", False):
            # vLLM >= 0.33 refuses it before this, through supports_sleep_mode; 0.32 never asks
            raise ConfigError(f"{type(self).__name__} does not support sleep mode.")
        transfer_config = self._kv_transfer_config
        self._config = KVStoreConfig.from_extra_config(transfer_config.kv_connector_extra_config)
        self._geometry = EngineGeometry.from_vllm(vllm_config, kv_cache_config, self._config)
        self._scheduler: ConnectorScheduler | None = None
        self._worker: ConnectorWorker | None = None
        self._runtime: SchedulerRuntime | None = None
        if role == KVConnectorRole.SCHEDULER:
            self._start_scheduler(vllm_config)
        else:
            from vllm.distributed.parallel_state import get_tensor_model_parallel_rank

            self._worker = ConnectorWorker(
                self._geometry, self._config, get_tensor_model_parallel_rank()
            )

    def _start_scheduler(self, vllm_config: VllmConfig) -> None:
        geo = self._geometry
        if not geo.is_hash_stable:
            logger.warning(_HASH_WARNING, geo.hash_algo)
        if geo.num_local_layers:
            logger.warning(
                _HYBRID_WARNING, geo.num_local_layers, len(geo.layer_names), geo.local_window_tokens
            )
        # A failed load is a cache miss: ask vLLM to recompute instead of failing the request.
        # (The scheduler reads this right after building its connector.)
        self._kv_transfer_config.kv_load_failure_policy = self._config.load_failure_policy  # type: ignore[assignment]
        runtime = SchedulerRuntime(self._config, geo)
        runtime.start()
        assert runtime.pipeline is not None
        self._runtime = runtime
        self._scheduler = ConnectorScheduler(
            geo,
            runtime.pipeline,
            runtime.metrics,
            num_workers=int(vllm_config.parallel_config.tensor_parallel_size),
            sync_load_budget_bytes=self._config.sync_load_budget_bytes,
            on_layout=runtime.register_layout,
            retention_tokens=self._config.hybrid_retention_tokens,
        )
        runtime.metrics.set_pipeline_source(self._scheduler.inflight)
        server = runtime.metrics_server
        facts = runtime.startup_facts()
        metrics_url = server.url if server is not None else None
        logger.info("%s", startup_line(self._config, facts, metrics_url=metrics_url))

    @classmethod
    def supports_sleep_mode(cls, kv_transfer_config: KVTransferConfig | None = None) -> bool:
        """No: vLLM >= 0.33 refuses `enable_sleep_mode` with kvstore, with its own message.

        Sleep discards the KV cache and, with it, asks the connector to reset its cache
        (`reset_cache`), which kvstore does not do: its tiers would serve KV computed with
        the weights from before the sleep. (0.32 never asks; `kv_transfer_config` is the one
        argument 0.33+ passes.) The KV memory itself is handled: `unregister_kv_caches`."""
        return False

    @property
    def requires_kv_delivery(self) -> bool:
        return False  # a best-effort cache: a dropped store is just a future miss

    @property
    def scheduler(self) -> ConnectorScheduler:
        if self._scheduler is None:
            raise RuntimeError("not the scheduler-side connector")
        return self._scheduler

    @property
    def worker(self) -> ConnectorWorker:
        if self._worker is None:
            raise RuntimeError("not the worker-side connector")
        return self._worker

    @property
    def runtime(self) -> SchedulerRuntime | None:
        return self._runtime

    # -- worker side ------------------------------------------------------------------------

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        self.worker.register_kv_caches(kv_caches)

    def unregister_kv_caches(self) -> None:
        """vLLM >= 0.33 is about to free or re-map the KV memory (sleep; on 0.34 also its
        extensible KV cache releasing memory with sleep mode off)."""
        self.worker.unregister_kv_caches()

    def restore_kv_caches(self) -> None:
        self.worker.restore_kv_caches()

    def handle_preemptions(self, kv_connector_metadata: KVConnectorMetadata) -> None:
        if isinstance(kv_connector_metadata, KVStoreConnectorMetadata):
            self.worker.handle_preemptions(kv_connector_metadata)

    def start_load_kv(self, forward_context: ForwardContext, **kwargs: Any) -> None:
        meta = self._get_connector_metadata()
        if isinstance(meta, KVStoreConnectorMetadata):
            self.worker.start_load_kv(meta)

    def wait_for_layer_load(self, layer_name: str) -> None:
        return  # sync loads finish before the forward (CPU) or are ordered on the stream (CUDA)

    def save_kv_layer(
        self,
        layer_name: str,
        kv_layer: torch.Tensor,
        attn_metadata: AttentionMetadata,
        **kwargs: Any,
    ) -> None:
        return  # stores copy whole chunks after the forward, in wait_for_save

    def wait_for_save(self) -> None:
        meta = self._get_connector_metadata()
        if isinstance(meta, KVStoreConnectorMetadata):
            self.worker.wait_for_save(meta)

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None, set[str] | None]:
        return self.worker.get_finished(finished_req_ids)

    def get_block_ids_with_load_errors(self) -> set[int]:
        return self.worker.get_block_ids_with_load_errors()

    def build_connector_worker_meta(self) -> Any:
        return self._worker.build_connector_worker_meta() if self._worker is not None else None

    # -- scheduler side ---------------------------------------------------------------------

    def on_new_request(self, request: Request) -> None:
        self.scheduler.track(request)

    def get_num_new_matched_tokens(
        self, request: Request, num_computed_tokens: int
    ) -> tuple[int | None, bool]:
        return self.scheduler.get_num_new_matched_tokens(request, num_computed_tokens)

    def update_state_after_alloc(
        self, request: Request, blocks: KVCacheBlocks, num_external_tokens: int
    ) -> None:
        self.scheduler.update_state_after_alloc(request, blocks, num_external_tokens)

    def get_external_cache_hit_sources(
        self, request: Request, num_external_tokens: int
    ) -> dict[CacheHitSource, int]:
        return self.scheduler.hit_sources(request, num_external_tokens)

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> KVConnectorMetadata:
        return self.scheduler.build_connector_meta(scheduler_output)

    def update_connector_output(self, connector_output: KVConnectorOutput) -> None:
        self.scheduler.update_connector_output(connector_output)

    def request_finished(
        self, request: Request, block_ids: list[int]
    ) -> tuple[bool, dict[str, Any] | None]:
        return self.scheduler.request_finished(request)

    def request_finished_all_groups(
        self, request: Request, block_ids: tuple[list[int], ...]
    ) -> tuple[bool, dict[str, Any] | None]:
        """vLLM's call with the hybrid manager on (every engine: kvstore declares SupportsHMA);
        the blocks of every group stay alive until the request's stores are done."""
        return self.scheduler.request_finished(request, block_ids)

    def take_events(self) -> Iterable[KVCacheEvent]:
        return self.scheduler.take_events()

    def get_kv_connector_stats(self) -> KVConnectorStats | None:
        return self._scheduler.step_counters.take() if self._scheduler is not None else None

    @classmethod
    def build_kv_connector_stats(cls, data: dict[str, Any] | None = None) -> KVConnectorStats:
        return KVStoreConnectorStats(data=dict(data or {}))

    @classmethod
    def build_prom_metrics(
        cls,
        vllm_config: VllmConfig,
        metric_types: dict[type[PromMetric], type[PromMetricT]],
        labelnames: list[str],
        per_engine_labelvalues: dict[int, list[object]],
    ) -> KVConnectorPromMetrics:
        return KVStorePromMetrics(vllm_config, metric_types, labelnames, per_engine_labelvalues)

    def has_pending_push_work(self) -> bool:
        return self._scheduler is not None and self._scheduler.has_pending_work()

    # -- lifecycle --------------------------------------------------------------------------

    def shutdown(self) -> None:
        if self._worker is not None:
            self._worker.shutdown()
        runtime, self._runtime = self._runtime, None
        if runtime is not None:
            runtime.close()
