"""Option values: one parser per kind of value, shared by every integration's configuration.

`KVStoreConnector`'s `kv_connector_extra_config` (`kvstore.config`) and `LMDBTier`'s
`secondary_tiers` entry (`kvstore.vllm.lmdb_tier.options`) parse their values here, so a value
one accepts the other accepts too, with the same checks: sizes as ints or "4GiB", finite
numbers only, booleans as true/false (or "true"/"false"/"1"/"0"), non-empty strings, paths
without NUL characters, and unknown keys named with a guess at the one meant.

Every parser takes the key as its error messages should name it (`label`: "cpu_bytes" for the
connector, "LMDBTier option 'capacity_bytes'" for the tier) and raises `ConfigError`.
"""

from __future__ import annotations

import difflib
import math
import os
from collections.abc import Callable, Collection, Mapping
from pathlib import Path
from typing import Any

from kvstore.errors import ConfigError

__all__ = [
    "Parser",
    "check_choice",
    "check_keys",
    "parse_bool",
    "parse_float",
    "parse_int",
    "parse_lower_str",
    "parse_optional_int",
    "parse_optional_lower_str",
    "parse_optional_path",
    "parse_optional_str",
    "parse_optional_upper_str",
    "parse_path",
    "parse_size",
    "parse_str",
    "parse_text",
    "parse_values",
    "require",
]

Parser = Callable[[str, Any], Any]
"""`parser(label, value)`: the parsed value, or ConfigError naming `label`."""

_SIZE_SUFFIXES = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_values(
    values: Mapping[str, Any],
    parsers: Mapping[str, Parser],
    *,
    known: Collection[str],
    what: str,
    label: Callable[[str], str] = str,
) -> dict[str, Any]:
    """Parse each value with its key's parser (a key without one is taken as it is); an
    unknown key raises ConfigError ("unknown {what} [...] (did you mean ...); allowed: ...")."""
    check_keys(values, known, what)
    return {name: parsers.get(name, _as_is)(label(name), value) for name, value in values.items()}


def check_keys(values: Mapping[Any, Any], known: Collection[str], what: str) -> None:
    unknown = sorted(set(values) - set(known), key=repr)
    if unknown:
        raise ConfigError(
            f"unknown {what} {unknown}{_did_you_mean(unknown, known)}; allowed: {sorted(known)}"
        )


def require(ok: bool, label: str, message: str) -> None:
    if not ok:
        raise ConfigError(f"{label}: {message}")


def check_choice(label: str, value: str, allowed: Collection[str]) -> None:
    require(value in allowed, label, f"got {value!r}; allowed: {', '.join(allowed)}")


def _did_you_mean(unknown: list[Any], known: Collection[str]) -> str:
    """`" (did you mean 'cpu_bytes'?)"` for a near miss, else `""`."""
    guesses = [
        close[0]
        for key in unknown
        if isinstance(key, str) and (close := difflib.get_close_matches(key, known, n=1))
    ]
    return f" (did you mean {', '.join(map(repr, guesses))}?)" if guesses else ""


def _as_is(label: str, value: Any) -> Any:
    return value


# -- parsers --------------------------------------------------------------------------------


def parse_size(label: str, value: object) -> int:
    """A byte size: an int, or a string like "4GiB", "512M", "1.5g"."""
    if isinstance(value, bool):
        raise ConfigError(f"{label}: expected a size in bytes, got {value!r}")
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str):
        text = value.strip().lower().removesuffix("ib").removesuffix("b")
        scale = _SIZE_SUFFIXES.get(text[-1:], 1)
        number = text[:-1] if text[-1:] in _SIZE_SUFFIXES else text
        try:
            return int(float(number) * scale)
        except (ValueError, OverflowError):  # not a number, NaN or infinite
            pass
    raise ConfigError(
        f"{label}: expected a size in bytes (e.g. 4294967296 or '4GiB'), got {value!r}"
    )


def parse_int(label: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ConfigError(f"{label}: expected an integer, got {value!r}")
    try:
        return int(value)
    except ValueError as exc:
        raise ConfigError(f"{label}: expected an integer, got {value!r}") from exc


def parse_optional_int(label: str, value: object) -> int | None:
    return None if value is None else parse_int(label, value)


def parse_float(label: str, value: object) -> float:
    """A finite number (NaN and infinities are refused: they break every deadline)."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ConfigError(f"{label}: expected a number, got {value!r}")
    try:
        number = float(value)
    except (ValueError, OverflowError) as exc:
        raise ConfigError(f"{label}: expected a number, got {value!r}") from exc
    if not math.isfinite(number):
        raise ConfigError(f"{label}: expected a finite number, got {value!r}")
    return number


def parse_bool(label: str, value: object) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false", "1", "0"):
        return value.strip().lower() in ("true", "1")
    raise ConfigError(f"{label}: expected true or false, got {value!r}")


def parse_str(label: str, value: object) -> str:
    """A non-empty string."""
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{label}: expected a non-empty string, got {value!r}")
    return value


def parse_text(label: str, value: object) -> str:
    """Any string, the empty one included (e.g. a salt)."""
    if not isinstance(value, str):
        raise ConfigError(f"{label}: expected a string, got {value!r}")
    return value


def parse_optional_str(label: str, value: object) -> str | None:
    return None if value is None else parse_str(label, value)


def parse_lower_str(label: str, value: object) -> str:
    return parse_str(label, value).lower()


def parse_optional_lower_str(label: str, value: object) -> str | None:
    return None if value is None else parse_lower_str(label, value)


def parse_optional_upper_str(label: str, value: object) -> str | None:
    return None if value is None else parse_str(label, value).upper()


def parse_path(label: str, value: object) -> Path:
    """A non-empty path string without NUL characters; `~` is expanded."""
    text = parse_str(label, value)
    if "\0" in text:
        raise ConfigError(f"{label}: a path cannot contain a NUL character, got {value!r}")
    return Path(os.path.expanduser(text))


def parse_optional_path(label: str, value: object) -> Path | None:
    return None if value is None else parse_path(label, value)
