"""LMDBTier's options, namespace, vLLM's factory path, and its metrics endpoint."""

from __future__ import annotations

import urllib.request
from pathlib import Path
from typing import Any

import pytest
from vllm.v1.kv_offload.base import Locality
from vllm.v1.kv_offload.tiering.factory import SecondaryTierFactory

from kvstore.errors import ConfigError
from kvstore.namespace import namespace_id
from kvstore.vllm import LMDBTier

from .helpers import SLOT_BYTES, Harness, tiering_spec

TIER = {"type": "LMDBTier", "module_path": "kvstore.vllm"}


def test_the_factory_resolves_the_tier_by_module_path() -> None:
    assert SecondaryTierFactory.get_tier_class(dict(TIER)) is LMDBTier


def test_the_factory_builds_the_tier_from_a_config_dict(harness: Harness) -> None:
    config = {
        **TIER,
        "path": str(harness.path),
        "capacity_bytes": "1MiB",
        "eviction_policy": "ARC",
        "locality": "local",
        "backpressure": {"backpressure_cls": "EMABackpressureDetector"},
    }
    tier = SecondaryTierFactory.create_secondary_tier(
        config, memoryview(harness.primary), harness.spec
    )
    harness.tiers.append(tier)  # type: ignore[arg-type]
    assert isinstance(tier, LMDBTier)
    assert (tier.tier_type, tier.locality, tier.block_size_bytes) == (
        "LMDBTier", Locality.LOCAL, SLOT_BYTES,
    )  # fmt: skip
    assert (tier.options.capacity_bytes, tier.options.eviction_policy) == (1 << 20, "arc")
    assert tier.bp_detector is not None
    assert tier.store.capacity_bytes == 1 << 20
    assert config["type"] == "LMDBTier"  # the factory copies the dict


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"path": None}, "'path' is required"),
        ({"capacity_bytes": "lots"}, "'capacity_bytes': expected a size"),
        ({"capacity_bytes": 0}, "'capacity_bytes'"),
        ({"capacity_bytes": SLOT_BYTES - 1}, "'capacity_bytes'.*smaller than one chunk"),
        ({"eviction_policy": "fifo"}, "'eviction_policy'.*'fifo'.*lru, arc"),
        ({"num_read_threads": 0}, "'num_read_threads'"),
        ({"locality": "mars"}, "'locality'.*'MARS'.*LOCAL, REMOTE"),
        ({"metrics_port": 70000}, "'metrics_port'"),
        ({"enable_kv_events": "yes"}, "'enable_kv_events'.*'yes'"),
        ({"shutdown_timeout_s": -1}, "'shutdown_timeout_s'"),
        ({"capacity": 10}, r"unknown LMDBTier option\(s\) \['capacity'\]"),
    ],
)
def test_bad_options_stop_construction_naming_the_key(
    harness: Harness, options: dict[str, Any], match: str
) -> None:
    with pytest.raises(ConfigError, match=match):
        harness.open(**options)


def test_a_path_that_cannot_hold_a_store_is_named(harness: Harness, tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    with pytest.raises(ConfigError, match="'path': cannot open an LMDB store"):
        harness.open(path=str(blocker))


def test_the_namespace_fingerprints_what_the_bytes_mean(harness: Harness) -> None:
    tier = harness.open()
    descriptor = tier.descriptor
    assert (descriptor.model, descriptor.kv_dtype, descriptor.row_bytes) == (
        "tiny-llama", "bfloat16", SLOT_BYTES,
    )  # fmt: skip
    assert descriptor.layout["kv_cache_layout"] == "NHD"
    assert tier.namespace == namespace_id(descriptor)
    stored = tier.store.namespaces()[tier.namespace]
    assert stored["namespace_id"] == tier.namespace and stored["created_by"].endswith("LMDBTier")
    salted = harness.open(path=str(harness.path.parent / "salted"), namespace_salt="v2 weights")
    assert salted.namespace != tier.namespace
    tier.shutdown()
    assert harness.open().namespace == tier.namespace  # stable across restarts
    other = harness.open(spec=tiering_spec(engine_id="another-engine"), path=str(harness.path))
    assert other.namespace == tier.namespace  # the engine id does not change the bytes


def test_metrics_are_served_when_a_port_is_given(harness: Harness) -> None:
    tier = harness.open(metrics_port=0)
    assert tier.metrics_server is not None
    harness.store(tier, 1, 0, 2)
    with urllib.request.urlopen(tier.metrics_server.url, timeout=10) as response:
        text = response.read().decode()
    assert 'kvstore_stored_chunks_total{tier="disk"} 2.0' in text
    assert f'kvstore_tier_used_bytes{{tier="disk"}} {2.0 * SLOT_BYTES}' in text
    assert 'kvstore_tier_capacity_bytes{tier="disk"}' in text
    tier.shutdown()
    assert tier.metrics_server is None


def test_kvstore_vllm_exports_the_connector_and_the_tier() -> None:
    import kvstore.vllm

    assert kvstore.vllm.__all__ == ["KVStoreConnector", "LMDBTier"]
    assert kvstore.vllm.LMDBTier is LMDBTier
