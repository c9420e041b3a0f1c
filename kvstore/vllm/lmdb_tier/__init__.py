"""`LMDBTier`: kvstore's LMDB store as a secondary tier of vLLM's own `TieringOffloadingSpec`.

GPU users of vLLM's native offloading (the `OffloadingConnector` with its CPU tier) add a
bounded, persistent, checksummed disk tier that the `kvstore` CLI can inspect:

    "kv_connector_extra_config": {"spec_name": "TieringOffloadingSpec", "cpu_bytes_to_use": ...,
        "secondary_tiers": [{"type": "LMDBTier", "module_path": "kvstore.vllm",
                             "path": "/nvme/kvstore", "capacity_bytes": "100GiB"}]}

The tier drives the pipeline's disk-only configuration (`kvstore.pipeline.disk.DiskPipeline`),
which shares its disk rules with `KVStoreConnector`'s `TierPipeline`, and starts through the
same `open_disk_tier`. Modules: `tier` (the adapter: vLLM's calls -> pipeline operations),
`jobs` (vLLM's jobs in flight and their results), `options` (its config keys and namespace),
`slots` (vLLM's primary CPU tier as rows).
"""

from kvstore.vllm.lmdb_tier.tier import LMDBTier

__all__ = ["LMDBTier"]
