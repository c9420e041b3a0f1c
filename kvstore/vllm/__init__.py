"""vLLM integration: the only package of kvstore that imports vLLM.

- `KVStoreConnector`: the full GPU -> CPU -> LMDB pipeline (`kv_connector_module_path`).
- `LMDBTier`: an LMDB disk tier behind vLLM's own CPU tier (`TieringOffloadingSpec`'s
  `secondary_tiers`, `"module_path": "kvstore.vllm"`).
"""

from kvstore.vllm.startup import check_config_being_built

# vLLM imports this package while it builds its config, long before the model loads: a bad
# `kv_connector_extra_config` fails here, in the user's process, as the last line it prints.
check_config_being_built()

from kvstore.vllm.connector import KVStoreConnector  # noqa: E402
from kvstore.vllm.lmdb_tier import LMDBTier  # noqa: E402

__all__ = ["KVStoreConnector", "LMDBTier"]
