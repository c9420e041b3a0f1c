"""Storage media for kvstore: the engine's paged KV view, the shared CPU region, LMDB on disk.

Synchronous code only; this package imports neither `kvstore`, `asyncio` nor `vllm`.
"""
