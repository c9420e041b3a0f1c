from __future__ import annotations

from pathlib import Path

import pytest

from kvstore.config import KVStoreConfig, parse_size
from kvstore.errors import ConfigError


def test_defaults_are_cpu_only() -> None:
    config = KVStoreConfig.from_extra_config({})
    assert not config.has_disk
    assert config.eviction_policy == "lru"
    assert config.write_policy == "write_through"


def test_issue_example_parses() -> None:
    config = KVStoreConfig.from_extra_config(
        {"cpu_bytes": 4294967296, "disk_path": "/nvme/kvstore", "disk_bytes": 107374182400}
    )
    assert config.cpu_bytes == 4 << 30
    assert config.disk_path == Path("/nvme/kvstore")
    assert config.disk_bytes == 100 << 30


@pytest.mark.parametrize(
    ("text", "expected"),
    [("4GiB", 4 << 30), ("512M", 512 << 20), ("1.5g", 3 << 29), ("1024", 1024), (7, 7)],
)
def test_sizes(text: object, expected: int) -> None:
    assert parse_size("cpu_bytes", text) == expected


@pytest.mark.parametrize(
    ("extra", "names"),
    [
        ({"cpu_bites": 1}, "cpu_bites"),
        ({"cpu_bytes": 0}, "cpu_bytes"),
        ({"cpu_bytes": "lots"}, "cpu_bytes"),
        ({"cpu_bytes": True}, "cpu_bytes"),
        ({"disk_bytes": 10}, "disk_bytes"),
        ({"disk_path": "/tmp/x"}, "disk_bytes"),
        ({"eviction_policy": "fifo"}, "lru, arc"),
        ({"write_policy": "sometimes"}, "write_through"),
        ({"metrics_port": 70000}, "metrics_port"),
        ({"block_size": "big"}, "block_size"),
        ({"block_size": -32}, "block_size"),
    ],
)
def test_bad_values_name_the_key(extra: dict[str, object], names: str) -> None:
    with pytest.raises(ConfigError, match=names):
        KVStoreConfig.from_extra_config(extra)
