"""The remote tier: a Redis server or Redis Cluster shared by many engines.

    RemoteConfig.from_values(extra)   the remote_* keys, validated (None without remote_url)
    RemoteStore(config)               batched, bounded, breaker-guarded byte access
    RemoteChunks(store, descriptor)   one namespace's chunks: value format, verification
    RemovalWatcher(store, ns, sink)   Redis's own removals (evicted, expired, del) as keys

Errors are drawn in `kvstore.remote.errors`; the value format in `kvstore.remote.codec`.
"""

from __future__ import annotations

from kvstore.remote.breaker import BreakerState, CircuitBreaker
from kvstore.remote.chunks import RemoteChunks
from kvstore.remote.client import RemoteStore
from kvstore.remote.config import REMOTE_CONFIG_DEFAULTS, RemoteConfig
from kvstore.remote.errors import (
    RemoteAuthError,
    RemoteConfigError,
    RemoteCorruptError,
    RemoteError,
    RemoteFormatError,
    RemoteUnavailableError,
    RemoteValueError,
    RemoteVersionError,
)
from kvstore.remote.removals import RemovalSink, RemovalWatcher
from kvstore.remote.stats import RemoteObserver, RemoteStats
from kvstore.remote.url import RemoteEndpoint, parse_remote_url

__all__ = [
    "REMOTE_CONFIG_DEFAULTS",
    "BreakerState",
    "CircuitBreaker",
    "RemoteAuthError",
    "RemovalSink",
    "RemovalWatcher",
    "RemoteChunks",
    "RemoteConfig",
    "RemoteConfigError",
    "RemoteCorruptError",
    "RemoteEndpoint",
    "RemoteError",
    "RemoteFormatError",
    "RemoteObserver",
    "RemoteStats",
    "RemoteStore",
    "RemoteUnavailableError",
    "RemoteValueError",
    "RemoteVersionError",
    "parse_remote_url",
]
