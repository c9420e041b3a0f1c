"""vLLM integration: the only package of kvstore that imports vLLM.

- `KVStoreConnector`: the full GPU -> CPU -> LMDB pipeline (`kv_connector_module_path`).
"""

from kvstore.vllm.connector import KVStoreConnector

__all__ = ["KVStoreConnector"]
