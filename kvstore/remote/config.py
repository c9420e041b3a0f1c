"""The remote tier's settings (`remote_*` keys of `kv_connector_extra_config`), validated.

    remote_url           where Redis is (see kvstore.remote.url); unset = no remote tier
    remote_password_env  NAME of the environment variable holding the password (the password is
                         read at connect and kept nowhere else: not in this config, its repr,
                         logs, errors or metrics)
    remote_timeout_ms    the most any remote call may take, connect included (default 500)
    remote_queue_chunks  bound of the write-through queue to remote (default 256, as the disk's)
    remote_write         false for read-only replicas: they read, never write (default true)

Every bad value raises `RemoteConfigError` (a `ConfigError`) naming the key and what is allowed.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass

from kvstore.remote.errors import RemoteConfigError
from kvstore.remote.url import RemoteEndpoint, parse_remote_url

__all__ = ["REMOTE_CONFIG_DEFAULTS", "RemoteConfig"]

REMOTE_CONFIG_DEFAULTS: Mapping[str, object] = {
    "remote_url": None,
    "remote_password_env": None,
    "remote_timeout_ms": 500,
    "remote_queue_chunks": 256,
    "remote_write": True,
}
"""The user-facing keys and their defaults."""

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_TRUE = ("true", "1", "yes", "on")
_FALSE = ("false", "0", "no", "off")


def _fail(key: str, message: str) -> RemoteConfigError:
    return RemoteConfigError(f"{key}: {message}")


def _int(key: str, value: object, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise _fail(key, f"expected an integer >= {minimum}, got {value!r}")
    try:
        number = int(value)
    except ValueError:
        raise _fail(key, f"expected an integer >= {minimum}, got {value!r}") from None
    if number < minimum:
        raise _fail(key, f"must be >= {minimum}, got {number}")
    return number


def _bool(key: str, value: object) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in _TRUE + _FALSE:
        return value.strip().lower() in _TRUE
    raise _fail(key, f"expected true or false, got {value!r}")


def _env_name(value: object) -> str | None:
    key = "remote_password_env"
    if value is None:
        return None
    if not isinstance(value, str) or not _ENV_NAME.fullmatch(value):
        # Not echoed: someone may have put the password itself here.
        raise _fail(
            key,
            "expected the NAME of an environment variable holding the password "
            "(letters, digits, '_'; e.g. KVSTORE_REDIS_PASSWORD), not the password itself",
        )
    return value


@dataclass(frozen=True, slots=True)
class RemoteConfig:
    """Validated remote tier settings. The password is not here: `password()` reads it."""

    endpoint: RemoteEndpoint
    password_env: str | None = None
    timeout_ms: int = 500
    queue_chunks: int = 256
    enable_write: bool = True
    # Circuit breaker tuning (not user keys): open after this many consecutive failures, probe
    # again after a backoff that doubles from `breaker_backoff_s` up to `breaker_backoff_max_s`.
    breaker_failures: int = 3
    breaker_backoff_s: float = 1.0
    breaker_backoff_max_s: float = 30.0
    # Removal subscriptions reconnect with the same doubling backoff.
    subscribe_backoff_s: float = 0.5
    subscribe_backoff_max_s: float = 10.0
    scan_count: int = 512
    # Most value bytes in one pipeline: bigger batches to a node go out as several pipelines
    # in a row (see RemoteStore); lookups and small values stay one round trip per node.
    pipeline_bytes: int = 4 << 20

    @property
    def timeout_s(self) -> float:
        return self.timeout_ms / 1000.0

    @classmethod
    def from_values(cls, values: Mapping[str, object]) -> RemoteConfig | None:
        """Parse the `remote_*` keys of a config mapping (others are ignored); None when
        `remote_url` is unset. Bad values raise `RemoteConfigError` naming the key."""
        remote = {k: v for k, v in values.items() if k.startswith("remote_")}
        unknown = sorted(set(remote) - set(REMOTE_CONFIG_DEFAULTS))
        if unknown:
            raise RemoteConfigError(
                f"unknown remote tier key(s) {unknown}; allowed: {sorted(REMOTE_CONFIG_DEFAULTS)}"
            )
        merged = {**REMOTE_CONFIG_DEFAULTS, **remote}
        url = merged["remote_url"]
        if url is None:
            for key in ("remote_password_env",):
                if merged[key] is not None:
                    raise _fail(key, "is set but remote_url is not")
            return None
        if not isinstance(url, str):
            raise _fail("remote_url", f"expected a string like redis://host:6379/0, got {url!r}")
        config = cls(
            endpoint=parse_remote_url(url),
            password_env=_env_name(merged["remote_password_env"]),
            timeout_ms=_int("remote_timeout_ms", merged["remote_timeout_ms"], 1),
            queue_chunks=_int("remote_queue_chunks", merged["remote_queue_chunks"], 1),
            enable_write=_bool("remote_write", merged["remote_write"]),
        )
        config.validate()
        return config

    def validate(self) -> None:
        """Check the values and that the password variable is set (not its content)."""
        if self.timeout_ms < 1:
            raise _fail("remote_timeout_ms", f"must be >= 1, got {self.timeout_ms}")
        if self.queue_chunks < 1:
            raise _fail("remote_queue_chunks", f"must be >= 1, got {self.queue_chunks}")
        if self.password_env is not None:
            _env_name(self.password_env)
            if not os.environ.get(self.password_env):
                raise _fail(
                    "remote_password_env",
                    f"environment variable {self.password_env} is not set or empty",
                )
        if self.breaker_failures < 1:
            raise ValueError(f"breaker_failures must be >= 1, got {self.breaker_failures}")
        if not 0 < self.breaker_backoff_s <= self.breaker_backoff_max_s:
            raise ValueError(
                f"need 0 < breaker_backoff_s ({self.breaker_backoff_s}) <= "
                f"breaker_backoff_max_s ({self.breaker_backoff_max_s})"
            )

    def password(self) -> str | None:
        """The password, read from the environment now (None without remote_password_env)."""
        if self.password_env is None:
            return None
        value = os.environ.get(self.password_env)
        if not value:
            raise _fail(
                "remote_password_env",
                f"environment variable {self.password_env} is not set or empty",
            )
        return value
