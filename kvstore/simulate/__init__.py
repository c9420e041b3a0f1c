"""Replay prompt traces through the real `TierPipeline` to size tiers and compare policies.

Pure: no I/O besides `load_trace`, no vLLM, no threads. Each engine is a `TierPipeline` over an
`InlineTierService` (its disk an in-memory store; rows of a few bytes, while the tiers account in
`chunk_bytes`), driven the way vLLM drives the connector: the engine's own prefix cache first (when
modelled), then the pipeline's lookup of the rest, asked again while it answers pending (disk
promotions, remote probes and fetches run in between, as at vLLM's next step), the load of the hit,
and the store of the chunks the engine computed. The I/O the pipeline starts (write-through to disk
and to the remote tier) lands before the engine stores and before the next prompt. Hits per tier are
what the pipeline reports to its observers (`record_lookup`); stores to disk and the remote tier,
and evictions, are its events.

`simulate_replicas` models N engines behind a router, each with its own engine cache, CPU and disk
tiers, sharing one remote tier (`SharedRemote`, Redis with `maxmemory` and `allkeys-lru`); the
pipeline probes it for the chunks after its local (CPU and disk) prefix, fetches the leading run
found into CPU rows (written through to its local disk like any stored chunk), and writes the
chunks its engine computed to it. Remote writes always land (the real ones may be dropped under
load).
"""

from __future__ import annotations

from kvstore.hashing import chunk_keys
from kvstore.service.inline_remote import SharedRemote
from kvstore.simulate._replay import ROUTINGS, simulate, simulate_replicas, sweep
from kvstore.simulate._result import ReplicaSimulation, SimulationResult
from kvstore.simulate._trace import TraceFormatError, load_trace

__all__ = [
    "ROUTINGS",
    "ReplicaSimulation",
    "SharedRemote",
    "SimulationResult",
    "TraceFormatError",
    "chunk_keys",
    "load_trace",
    "simulate",
    "simulate_replicas",
    "sweep",
]
