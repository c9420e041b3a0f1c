"""Replay prompt traces through the real `TierIndex` to size tiers and compare policies.

Pure: no I/O besides `load_trace`, no vLLM. Each prompt goes through the index the way the
connector drives it: lookup (after the engine's own prefix cache, when modelled) → promote the
disk hits (completing at once) → load → store the chunks the engine computed → write them through.

`simulate_replicas` models N engines behind a router, each with its own engine cache, CPU and disk
tiers, sharing one remote tier (`SharedRemote`, Redis with `maxmemory` and `allkeys-lru`), as the
pipeline drives it: the chunks after the local (CPU and disk) prefix are probed in the remote
tier, the leading run found is fetched into CPU rows (then written through to the local disk like
any stored chunk), and the chunks the engine computed are written to the remote tier. Remote
writes land at once (the real ones are asynchronous and may be dropped under load).
"""

from __future__ import annotations

from kvstore.hashing import chunk_keys
from kvstore.simulate._replay import (
    ROUTINGS,
    SharedRemote,
    simulate,
    simulate_replicas,
    sweep,
)
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
