"""The remote tier: a Redis server or Redis Cluster shared by many engines.

    RemoteConfig.from_values(extra)   the remote_* keys, validated (None without remote_url)
    RemoteStore(config)               batched, bounded, breaker-guarded byte access
    RemoteChunks(store, descriptor)   one namespace's chunks: value format, verification
    RemovalWatcher(store, ns, sink)   Redis's own removals (evicted, expired, del) as keys

Errors are drawn in `kvstore.remote.errors`; the value format in `kvstore.remote.codec`.
"""

from __future__ import annotations

import importlib as _importlib
import typing as _typing

if _typing.TYPE_CHECKING:
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

# Names resolve on first use (PEP 562): the CLI and the config parser read `kvstore.remote.config`
# without importing redis-py (~0.2 s) through the client.
_SOURCES = {
    "BreakerState": "kvstore.remote.breaker",
    "CircuitBreaker": "kvstore.remote.breaker",
    "RemoteChunks": "kvstore.remote.chunks",
    "RemoteStore": "kvstore.remote.client",
    "REMOTE_CONFIG_DEFAULTS": "kvstore.remote.config",
    "RemoteConfig": "kvstore.remote.config",
    "RemoteAuthError": "kvstore.remote.errors",
    "RemoteConfigError": "kvstore.remote.errors",
    "RemoteCorruptError": "kvstore.remote.errors",
    "RemoteError": "kvstore.remote.errors",
    "RemoteFormatError": "kvstore.remote.errors",
    "RemoteUnavailableError": "kvstore.remote.errors",
    "RemoteValueError": "kvstore.remote.errors",
    "RemoteVersionError": "kvstore.remote.errors",
    "RemovalSink": "kvstore.remote.removals",
    "RemovalWatcher": "kvstore.remote.removals",
    "RemoteObserver": "kvstore.remote.stats",
    "RemoteStats": "kvstore.remote.stats",
    "RemoteEndpoint": "kvstore.remote.url",
    "parse_remote_url": "kvstore.remote.url",
}


def __getattr__(name: str) -> _typing.Any:
    module = _SOURCES.get(name)
    if module is None:
        raise AttributeError(f"module 'kvstore.remote' has no attribute {name!r}")
    return getattr(_importlib.import_module(module), name)


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
