from __future__ import annotations

import pytest

from kvstore.errors import ConfigError
from kvstore.index import IndexConfig


def config(**overrides: object) -> IndexConfig:
    values: dict[str, object] = {"num_cpu_rows": 8, "chunk_bytes": 64, "num_tokens_per_chunk": 16}
    values.update(overrides)
    return IndexConfig(**values)  # type: ignore[arg-type]


def test_defaults_have_no_disk_and_no_admission_filter() -> None:
    cfg = config()
    assert not cfg.has_disk
    assert cfg.cpu_policy == "lru" and cfg.write_policy == "write_through"
    assert cfg.admission_min_sightings == 1
    assert cfg.cpu_capacity_bytes == 8 * 64


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"num_cpu_rows": 0}, r"num_cpu_rows must be >= 1, got 0"),
        ({"num_cpu_rows": 2.5}, r"num_cpu_rows must be an integer, got 2.5"),
        ({"num_cpu_rows": True}, r"num_cpu_rows must be an integer"),
        ({"chunk_bytes": -1}, r"chunk_bytes must be >= 1, got -1"),
        ({"num_tokens_per_chunk": 0}, r"num_tokens_per_chunk must be >= 1"),
        ({"disk_capacity_bytes": -5}, r"disk_capacity_bytes must be >= 0 \(0 = no disk tier\)"),
        ({"disk_capacity_bytes": 10}, r"0 \(no disk tier\) or at least chunk_bytes \(64\), got 10"),
        ({"cpu_policy": "fifo"}, r"cpu_policy 'fifo' is unknown; allowed: 'lru', 'arc'"),
        ({"disk_policy": "LRU"}, r"disk_policy 'LRU' is unknown"),
        (
            {"write_policy": "write_back"},
            r"'write_back' is not supported.*Allowed: 'write_through'",
        ),
        ({"write_policy": "never"}, r"write_policy 'never' is unknown"),
        ({"admission_min_sightings": 0}, r"admission_min_sightings must be >= 1 \(1 = off\)"),
    ],
)
def test_bad_values_are_named(overrides: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        config(**overrides)


@pytest.mark.parametrize("name", ["write_back", "sometimes"])
def test_the_connector_config_refuses_a_write_policy_as_the_index_does(name: str) -> None:
    from kvstore.config import KVStoreConfig

    with pytest.raises(ConfigError) as by_index:
        config(write_policy=name)
    with pytest.raises(ConfigError) as by_connector:
        KVStoreConfig.from_extra_config({"write_policy": name})
    assert str(by_index.value) in str(by_connector.value)
