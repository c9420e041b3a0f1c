"""The disk-writer process: LMDB writes of the CPU tier's chunks, out of the engine's process.

The connector's write-through (checksum, copy into LMDB, commit), evictions and touches run in a
child process that maps the CPU region read-only and is the store's writer, at a low CPU and I/O
priority (`priority`), so it takes little from the engine when the engine wants every core, and
never the engine's GIL. The engine's side
(`DiskWriterProcess`, in `client`) sends row numbers, not bytes, and waits (GIL released) for the
commit: a write is acknowledged only once it is on disk, as before. Modules: `protocol` (the
messages), `priority` (lowering the child's priority), `child` (the child's main), `client`.

Imports stay light (no torch, no asyncio, no vLLM): the child starts in about 0.2 s.
"""
