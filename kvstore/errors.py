"""Errors raised by kvstore.

    KVStoreError
    ├── ConfigError        a bad config key or CLI option: names it and what is allowed
    ├── ExtraConfigError   a bad `kv_connector_extra_config`, found while vLLM builds its config
    ├── StoreNotFoundError a path that is not a kvstore store
    ├── KeyLookupError     a key prefix that matches nothing, or several keys
    └── RecordError        a stored or streamed record (an event batch, a namespace descriptor)
                           that cannot be decoded: names the record and what is wrong

Errors from the storage media (`tiers.errors.TierError` and subclasses) pass through unchanged.
Expected outcomes on the step path (tier full, nothing evictable) are return values, not errors.
"""

from __future__ import annotations

__all__ = [
    "ConfigError",
    "ExtraConfigError",
    "KVStoreError",
    "KeyLookupError",
    "RecordError",
    "StoreNotFoundError",
]


class KVStoreError(Exception):
    """Root of kvstore's own errors."""


class ConfigError(KVStoreError, ValueError):
    """A configuration value is missing, unknown or out of range."""


class ExtraConfigError(KVStoreError):
    """ConfigError's message, raised inside vLLM's config construction. Deliberately not a
    ValueError: vLLM's config is a pydantic dataclass, which would turn a ValueError into a
    ValidationError and end the traceback with a link to pydantic's docs instead of the key."""


class StoreNotFoundError(KVStoreError):
    """The path does not hold a kvstore store."""


class KeyLookupError(KVStoreError, LookupError):
    """A key or key prefix matches no chunk, or more than one."""


class RecordError(KVStoreError, ValueError):
    """A record read from a store, a stream or a file is malformed (never a crash, never data)."""
