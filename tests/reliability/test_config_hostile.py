"""`KVStoreConfig.from_extra_config` on hostile values: a ConfigError naming the key, never a
TypeError or OverflowError, and nothing accepted that fails later (an infinite timeout, a NUL)."""

from __future__ import annotations

from typing import Any

import pytest

from kvstore.config import KVStoreConfig
from kvstore.errors import ConfigError


@pytest.mark.parametrize(
    ("extra", "key"),
    [
        ({"cpu_bytes": "1e999"}, "cpu_bytes"),
        ({"disk_bytes": "-inf", "disk_path": "/tmp/x"}, "disk_bytes"),
        ({"events_log_max_bytes": "inf"}, "events_log_max_bytes"),
        ({"shutdown_timeout_s": "inf"}, "shutdown_timeout_s"),
        ({"shutdown_timeout_s": 1e400}, "shutdown_timeout_s"),
        ({"disk_path": "/tmp/a\x00b", "disk_bytes": 1}, "disk_path"),
        ({"region_dir": "\x00"}, "region_dir"),
        ({"events_log": "log\x00.jsonl"}, "events_log"),
    ],
    ids=repr,
)
def test_a_hostile_value_is_a_config_error_naming_the_key(extra: dict[str, Any], key: str) -> None:
    with pytest.raises(ConfigError, match=f"^{key}: "):
        KVStoreConfig.from_extra_config(extra)


@pytest.mark.parametrize("extra", [{1: 2, "a": 3}, {None: 1}, {(1,): 2, "b": 1}], ids=repr)
def test_keys_that_are_not_strings_are_unknown_keys(extra: dict[Any, Any]) -> None:
    with pytest.raises(ConfigError, match="unknown kv_connector_extra_config key"):
        KVStoreConfig.from_extra_config(extra)


@pytest.mark.parametrize("extra", [[("cpu_bytes", 1)], "cpu_bytes=1", 5])
def test_an_extra_config_that_is_no_mapping_is_a_config_error(extra: Any) -> None:
    with pytest.raises(ConfigError, match="must be a mapping"):
        KVStoreConfig.from_extra_config(extra)
