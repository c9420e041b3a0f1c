"""Errors of the remote tier.

    KVStoreError
    └── RemoteError               anything the remote tier raises
        ├── RemoteConfigError     also a ConfigError: a bad remote_* value, named
        │   └── RemoteAuthError   the server refused the password (names remote_password_env)
        ├── RemoteUnavailableError  the server is down, hung or its breaker is open
        └── RemoteValueError      a stored value that must not reach the engine
            ├── RemoteCorruptError  checksum or size mismatch: a miss, a DEL, a counted error
            └── RemoteFormatError   not ours, or another namespace's or key's bytes
                └── RemoteVersionError  written by a newer kvstore: a miss, left in place

The data path (`RemoteStore.get_many`, `exists_many`, `put_many`, ...) does not raise
`RemoteUnavailableError`: an unavailable server is a miss or a failed put, within the timeout.
Administrative calls (`scan_keys`, descriptors) raise it, so a CLI can say the server is down.
No message ever holds a password.
"""

from __future__ import annotations

from kvstore.errors import ConfigError, KVStoreError

__all__ = [
    "RemoteAuthError",
    "RemoteConfigError",
    "RemoteCorruptError",
    "RemoteError",
    "RemoteFormatError",
    "RemoteUnavailableError",
    "RemoteValueError",
    "RemoteVersionError",
]


class RemoteError(KVStoreError):
    """Root of the remote tier's errors."""


class RemoteConfigError(RemoteError, ConfigError):
    """A remote_* config value is missing, malformed or refused by the server."""


class RemoteAuthError(RemoteConfigError):
    """The server refused the credentials (wrong or missing password, unknown user)."""


class RemoteUnavailableError(RemoteError):
    """The server did not answer within the timeout, refused the connection, or its circuit
    breaker is open."""


class RemoteValueError(RemoteError):
    """A stored value failed verification; never handed to the engine."""


class RemoteCorruptError(RemoteValueError):
    """The payload's size or xxh64 does not match its header (a flipped byte, a truncation)."""


class RemoteFormatError(RemoteValueError):
    """Not a kvstore value (bad magic), or a value of another namespace or chunk key."""


class RemoteVersionError(RemoteFormatError):
    """A value format newer than this kvstore understands."""
