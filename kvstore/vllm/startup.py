"""What a vLLM user sees of kvstore in their own process.

- **Config errors before the model loads.** vLLM 0.32 builds a KV connector only once the model
  has loaded and the KV cache is sized (both roles need `kv_cache_config`), so a typo in
  `kv_connector_extra_config` checked there costs a whole model load, and vLLM's own
  "Engine core initialization failed" ends the log instead of kvstore's message. The earliest
  moment vLLM hands kvstore anything is while `VllmConfig.__post_init__` resolves the connector
  class (`KVConnectorFactory.get_connector_class(kv_transfer_config)`, asking whether it supports
  the hybrid KV cache manager): that imports `kv_connector_module_path`, this package. So, on
  import, `check_config_being_built` looks for that `KVTransferConfig` in the importing frames
  and validates its extra config; the error (an ExtraConfigError, which pydantic does not
  wrap) propagates out of vLLM's config construction,
  in the user's process, and is the last line of the traceback. Where no such frame exists (a
  script importing kvstore.vllm itself, an engine process that received a built config), it
  does nothing, and the connector validates again when it is built.
- **kvstore's log records through vLLM's handlers.** vLLM configures only its own `vllm` logger
  (propagate off); kvstore logs under `kvstore.*` and `tiers.*`, which would reach no handler:
  INFO lines vanish, warnings print bare. `route_logs_to_vllm` gives those two loggers vLLM's
  handlers and level (`tiers` from WARNING up), unless the application configured logging.
- **One start-up line** (`startup_line`): tiers, sizes, chunk tokens, chunks servable after a
  restart, the metrics URL.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Mapping
from types import FrameType
from typing import Any

from kvstore.config import KVStoreConfig
from kvstore.errors import ConfigError, ExtraConfigError

__all__ = ["check_config_being_built", "route_logs_to_vllm", "startup_line"]

CONNECTOR_NAME = "KVStoreConnector"
MODULE_PATH = "kvstore.vllm"
_MAX_FRAMES = 64  # vLLM's config construction sits well within this many frames of the import
# kvstore's INFO lines are few (the start-up line, rare events); the storage media's are
# details of the start (region and store created), so only their warnings go to vLLM's log.
_OUR_LOGGERS = {"kvstore": logging.NOTSET, "tiers": logging.WARNING}


def check_config_being_built(frame: FrameType | None = None) -> None:
    """Validate the extra config of the `KVTransferConfig` that vLLM is resolving (see the
    module docstring), and refuse a model kvstore cannot serve; raises kvstore's ConfigError
    naming the key or the model."""
    frame = sys._getframe(1) if frame is None else frame
    transfer: object = None
    model_config: object = None
    for _ in range(_MAX_FRAMES):
        if frame is None:
            break
        candidate = frame.f_locals.get("kv_transfer_config")
        if transfer is None and _is_kvstore_config(candidate):
            transfer = candidate
        owner = frame.f_locals.get("self")
        if model_config is None and type(owner).__name__ == "VllmConfig":
            model_config = getattr(owner, "model_config", None)
        frame = frame.f_back
    if transfer is None:
        return
    try:
        KVStoreConfig.from_extra_config(getattr(transfer, "kv_connector_extra_config", None))
    except ConfigError as exc:
        message = str(exc)
        if "kv_connector_extra_config" not in message:
            message = f"kv_connector_extra_config: {message}"
        raise ExtraConfigError(message) from None
    if model_config is not None:
        _check_model(model_config)


def _check_model(model_config: object) -> None:
    """Models with Mamba / linear-attention state: kvstore stores attention KV (full-attention
    and sliding-window KV cache groups), not recurrent state, so it refuses them before any
    weights load rather than after (`EngineGeometry` would refuse their groups)."""
    try:
        kinds = [
            kind
            for kind, flag in (("hybrid", "is_hybrid"), ("attention-free", "is_attention_free"))
            if getattr(model_config, flag, False) is True
        ]
    except Exception:  # a model vLLM cannot describe yet: vLLM's own checks speak for it
        return
    if kinds:
        raise ExtraConfigError(
            f"KVStoreConnector cannot serve {getattr(model_config, 'model', 'this model')}: it "
            f"is a {kinds[0]} model with Mamba / linear-attention state layers, and "
            "KVStoreConnector stores attention KV only (full-attention and sliding-window "
            "layers), not recurrent state, whose prefix reuse needs a state per boundary. "
            "Serve this model without kvstore (README, Limits)."
        )


def _is_kvstore_config(candidate: object) -> bool:
    return (
        candidate is not None
        and getattr(candidate, "kv_connector", None) == CONNECTOR_NAME
        and getattr(candidate, "kv_connector_module_path", None) == MODULE_PATH
    )


def route_logs_to_vllm() -> None:
    """Give the `kvstore` and `tiers` loggers vLLM's handlers and level, once, when neither
    they nor the root logger have a handler (an application that configured logging keeps
    its own setup)."""
    vllm_logger = logging.getLogger("vllm")
    if not vllm_logger.handlers or logging.getLogger().handlers:
        return
    for name, least_level in _OUR_LOGGERS.items():
        ours = logging.getLogger(name)
        if ours.handlers:
            continue
        for handler in vllm_logger.handlers:
            ours.addHandler(handler)
        ours.setLevel(max(vllm_logger.getEffectiveLevel(), least_level))
        ours.propagate = False


def startup_line(
    config: KVStoreConfig, summary: Mapping[str, Any], *, metrics_url: str | None
) -> str:
    """E.g. `kvstore: CPU tier 4.0 GiB (1,024 chunks) in /dev/shm; disk tier 100.0 GiB at
    /nvme/kvstore, 380 chunks servable after restart; remote off; 256-token chunks of 4.0 MiB;
    namespace 1a2b3c4d5e6f7a8b; metrics http://127.0.0.1:9400/metrics`."""
    cpu = (
        f"CPU tier {_size(config.cpu_bytes)} ({summary['num_cpu_rows']:,} chunks) "
        f"in {config.region_dir}"
    )
    if not config.has_disk:
        disk = "disk tier off"
    elif summary["has_disk"]:
        disk = (
            f"disk tier {_size(config.disk_bytes)} at {config.disk_path}, "
            f"{summary['num_servable_chunks']:,} chunks servable after restart"
        )
    else:
        disk = f"disk tier at {config.disk_path} UNREADABLE (see the error above): CPU only"
    remote = f"remote {summary['remote']}" if summary.get("remote") else "remote off"
    chunks = f"{summary['num_tokens_per_chunk']}-token chunks of {_size(summary['row_bytes'])}"
    metrics = f"metrics {metrics_url}" if metrics_url else "metrics off (set metrics_port)"
    return "; ".join(
        ["kvstore: " + cpu, disk, remote, chunks, f"namespace {summary['namespace']}", metrics]
    )


def _size(num_bytes: int) -> str:
    value = float(num_bytes)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")  # pragma: no cover
