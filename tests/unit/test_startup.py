"""kvstore in a vLLM user's process: the config check while vLLM builds its config, log routing
into vLLM's handlers, and the start-up line. (The real-engine side: tests/test_readme.py and
tests/test_first_hour.py.)"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from kvstore.config import KVStoreConfig
from kvstore.errors import ExtraConfigError
from kvstore.vllm.startup import check_config_being_built, route_logs_to_vllm, startup_line


@dataclass
class FakeTransferConfig:  # the three fields of vLLM's KVTransferConfig that the check reads
    kv_connector: str = "KVStoreConnector"
    kv_connector_module_path: str = "kvstore.vllm"
    kv_connector_extra_config: dict[str, Any] = field(default_factory=dict)


def _resolve(kv_transfer_config: FakeTransferConfig) -> None:
    """Stands for vLLM's `get_connector_class(kv_transfer_config)`, which imports us."""
    _import_module()


def _import_module() -> None:
    check_config_being_built()


def test_a_misspelled_key_fails_with_a_did_you_mean() -> None:
    with pytest.raises(ExtraConfigError, match=r"\['cpu_byte'\] \(did you mean 'cpu_bytes'\?\)"):
        _resolve(FakeTransferConfig(kv_connector_extra_config={"cpu_byte": 1 << 20}))


def test_a_bad_value_names_the_key_and_is_not_a_value_error() -> None:
    with pytest.raises(ExtraConfigError, match="kv_connector_extra_config: disk_bytes") as info:
        _resolve(FakeTransferConfig(kv_connector_extra_config={"disk_path": "/tmp/x"}))
    assert not isinstance(info.value, ValueError)  # pydantic would bury a ValueError


def test_a_good_config_another_connector_or_no_config_pass() -> None:
    _resolve(FakeTransferConfig(kv_connector_extra_config={"cpu_bytes": "1GiB"}))
    _resolve(FakeTransferConfig(kv_connector="OffloadingConnector",
                                kv_connector_extra_config={"cpu_byte": 1}))  # fmt: skip
    _import_module()  # no KVTransferConfig among the callers: nothing to check


@pytest.fixture
def clean_loggers() -> Iterator[None]:
    names = ("vllm", "kvstore", "tiers", "")
    saved = {n: (logging.getLogger(n).handlers[:], logging.getLogger(n).level,
                 logging.getLogger(n).propagate) for n in names}  # fmt: skip
    for name in names:
        logging.getLogger(name).handlers = []
    yield
    for name, (handlers, level, propagate) in saved.items():
        logger = logging.getLogger(name)
        logger.handlers, logger.propagate = handlers, propagate
        logger.setLevel(level)


class Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.mark.usefixtures("clean_loggers")
def test_kvstore_info_lines_reach_vllms_handler() -> None:
    logging.getLogger().handlers = []  # pytest's capture handlers, added after the fixture
    vllm_handler = Collect()
    logging.getLogger("vllm").addHandler(vllm_handler)
    logging.getLogger("vllm").setLevel(logging.INFO)
    logging.getLogger("kvstore.vllm.runtime").info("before routing")
    route_logs_to_vllm()
    route_logs_to_vllm()  # idempotent: one handler, one record
    logging.getLogger("kvstore.vllm.runtime").info("kvstore: hello")
    logging.getLogger("tiers.cpu").info("tiers: created a region")  # a detail: not shown
    logging.getLogger("tiers.cpu").warning("tiers: careful")
    assert [r.getMessage() for r in vllm_handler.records] == ["kvstore: hello", "tiers: careful"]


@pytest.mark.usefixtures("clean_loggers")
def test_an_application_with_its_own_logging_keeps_it() -> None:
    logging.getLogger().handlers = []
    vllm_handler, root_handler = Collect(), Collect()
    logging.getLogger("vllm").addHandler(vllm_handler)
    logging.getLogger().addHandler(root_handler)
    route_logs_to_vllm()
    logging.getLogger("kvstore").warning("to the root only")
    assert vllm_handler.records == []
    assert [r.getMessage() for r in root_handler.records] == ["to the root only"]


def test_startup_line_says_tiers_sizes_chunks_servable_and_metrics() -> None:
    config = KVStoreConfig.from_extra_config(
        {"cpu_bytes": "4GiB", "disk_path": "/nvme/kvstore", "disk_bytes": "100GiB"}
    )
    facts = {"num_cpu_rows": 1024, "has_disk": True, "num_servable_chunks": 380, "remote": None,
             "num_tokens_per_chunk": 256, "row_bytes": 4 << 20, "namespace": "1a2b"}  # fmt: skip
    line = startup_line(config, facts, metrics_url="http://127.0.0.1:9400/metrics")
    assert line == (
        "kvstore: CPU tier 4.0 GiB (1,024 chunks) in /dev/shm; disk tier 100.0 GiB at "
        "/nvme/kvstore, 380 chunks servable after restart; remote off; 256-token chunks of "
        "4.0 MiB; namespace 1a2b; metrics http://127.0.0.1:9400/metrics"
    )
    unreadable = startup_line(config, {**facts, "has_disk": False}, metrics_url=None)
    assert "UNREADABLE" in unreadable
    assert unreadable.endswith("metrics off (set metrics_port)")
