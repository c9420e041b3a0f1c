"""vLLM integration: the only package of kvstore that imports vLLM.

- `KVStoreConnector`: the full GPU -> CPU -> LMDB pipeline (`kv_connector_module_path`).
- `LMDBTier`: an LMDB disk tier behind vLLM's own CPU tier (`TieringOffloadingSpec`'s
  `secondary_tiers`, `"module_path": "kvstore.vllm"`).
"""

from kvstore.vllm.connector import KVStoreConnector
from kvstore.vllm.lmdb_tier import LMDBTier

__all__ = ["KVStoreConnector", "LMDBTier"]
