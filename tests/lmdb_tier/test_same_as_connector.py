"""The behaviours that once drifted between LMDBTier and KVStoreConnector are now one behaviour.

Each test drives both integrations, each with a real LMDB store: LMDBTier through its
`SecondaryTierManager` calls (`Harness`), the connector through its scheduler process's runtime
(`SchedulerRuntime` with a fake engine geometry) and its `TierPipeline`. The five behaviours:
the removal reason of a chunk deleted behind the tier's back, when a disk record counts a hit,
the budget left by the store's other namespaces, a damaged store file, and option parsing.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from vllm.v1.kv_offload.base import LookupResult, ReqContext

from kvstore.config import KVStoreConfig
from kvstore.errors import ConfigError
from kvstore.events import ChunkRemoved, TierEvent
from kvstore.keys import BlockKey, Tier
from kvstore.vllm.lmdb_tier.options import LMDBTierOptions
from kvstore.vllm.runtime import SchedulerRuntime
from tests.connector.fakes import GEOMETRY
from tiers.errors import StoreIOError
from tiers.lmdb import LMDBStore

from .helpers import SLOT_BYTES, Harness, finish, job, key, metric

CTX = ReqContext(req_id="lookup")
ROW_BYTES = GEOMETRY.row_bytes  # the connector's chunk (one CPU row)
DISK_CHUNKS = 16


def k(i: int) -> BlockKey:
    return BlockKey(key(i))


@dataclass
class Connector:
    """KVStoreConnector's scheduler process without an engine: its runtime and pipeline,
    with the bytes a worker would copy written straight into the CPU rows."""

    runtime: SchedulerRuntime
    path: Path

    @property
    def namespace(self) -> str:
        return self.runtime.namespace

    def metric(self, name: str, **labels: str) -> float:
        return self.runtime.registry.get_sample_value(name, labels) or 0.0

    def store(self, *keys: BlockKey) -> None:
        pipeline, region = self.runtime.pipeline, self.runtime.region
        assert pipeline is not None and region is not None
        plan = pipeline.prepare_store(list(keys))
        assert plan is not None and plan.keys == keys
        for chunk_key, row in zip(plan.keys, plan.rows, strict=True):
            region.row(row)[:] = (chunk_key * ROW_BYTES)[:ROW_BYTES]
        pipeline.complete_store(plan.keys, ok=True)
        self.wait_for(lambda: set(keys) <= self.on_disk())

    def on_disk(self) -> frozenset[BlockKey]:
        assert self.runtime.index is not None
        return self.runtime.index.ready_keys(Tier.DISK)

    def wait_for(self, condition: Callable[[], bool], timeout_s: float = 10.0) -> None:
        """Apply the service's results until `condition` holds (a deadline, not a sleep)."""
        pipeline = self.runtime.pipeline
        assert pipeline is not None
        deadline_s = time.monotonic() + timeout_s
        while not condition():
            assert time.monotonic() < deadline_s, "the connector's disk work never finished"
            time.sleep(0.001)
            pipeline.poll()

    def load(self, owner: str, chunk_key: BlockKey, *, ok: bool) -> None:
        pipeline = self.runtime.pipeline
        assert pipeline is not None
        assert pipeline.prepare_lookup(owner, [chunk_key]).num_hits == 1
        plan = pipeline.prepare_load(owner, [chunk_key])
        pipeline.complete_load(plan.keys, ok=ok)  # what the worker's copy reported
        pipeline.forget(owner)


@pytest.fixture
def connector_at(tmp_path: Path) -> Iterator[Callable[..., Connector]]:
    runtimes: list[SchedulerRuntime] = []

    def start(**overrides: Any) -> Connector:
        path = tmp_path / "connector-store"
        values: dict[str, Any] = {
            "cpu_bytes": 2 * ROW_BYTES,
            "disk_path": path,
            "disk_bytes": DISK_CHUNKS * ROW_BYTES,
            "region_dir": tmp_path / "shm",
        }
        runtime = SchedulerRuntime(KVStoreConfig(**(values | overrides)), GEOMETRY)
        runtimes.append(runtime)
        runtime.start()
        runtime.register_layout({"test": "layout"})  # what the first worker does
        return Connector(runtime, path)

    yield start
    for runtime in runtimes:
        runtime.close()


def removals(events: list[TierEvent]) -> list[tuple[Tier, str, bytes]]:
    return [
        (event.tier, event.reason, bytes(chunk_key))
        for event in events
        if isinstance(event, ChunkRemoved)
        for chunk_key in event.keys
    ]


# -- 1. the removal reason of a chunk deleted behind the tier's back ------------------------


def test_a_chunk_deleted_behind_the_tier_is_removed_as_deleted_by_both(
    harness: Harness, connector_at: Callable[..., Connector]
) -> None:
    tier = harness.open()
    harness.store(tier, 1, 0, 1)
    tier.take_events()
    with LMDBStore.open(harness.path, capacity_bytes=64 * SLOT_BYTES) as other:  # `kvstore rm`
        other.delete_many(tier.namespace, [key(0)])
    tier.submit_load(job(2, [key(0)], [9], is_promotion=True))
    assert finish(tier, 2)[2].success is False
    vllm_events = [(e.removed, list(e.keys)) for e in tier.take_events()]
    assert vllm_events == [(True, [key(0)])]  # vLLM's STORAGE event carries no reason

    connector = connector_at(promotion_wait_ms=0)  # the lookup answers before the read
    connector.store(k(0))
    connector.store(k(1), k(2))  # two CPU rows: k(0) is now on disk only
    pipeline = connector.runtime.pipeline
    assert pipeline is not None
    pipeline.take_events()
    with LMDBStore.open(connector.path, capacity_bytes=DISK_CHUNKS * ROW_BYTES) as other:
        other.delete_many(connector.namespace, [k(0)])
    assert pipeline.prepare_lookup("r", [k(0)]).is_pending  # promoting from disk
    connector.wait_for(lambda: not pipeline.prepare_lookup("r", [k(0)]).is_pending)
    assert pipeline.prepare_lookup("r", [k(0)]).num_hits == 0
    pipeline.forget("r")

    on_disk = [removal for removal in removals(pipeline.take_events()) if removal[0] is Tier.DISK]
    assert on_disk == [(Tier.DISK, "deleted", key(0))]
    for read in (lambda name, **kw: metric(tier, name, **kw), connector.metric):
        assert read("kvstore_removed_chunks_total", tier="disk", reason="deleted") == 1
        assert read("kvstore_removed_chunks_total", tier="disk", reason="other") == 0


# -- 2. a disk record counts a hit when the load was served, not when it was prepared --------


def test_only_a_served_load_counts_a_hit_on_disk_in_both(
    harness: Harness, connector_at: Callable[..., Connector], monkeypatch: pytest.MonkeyPatch
) -> None:
    """key(0)'s load fails, key(1)'s is served: only key(1) counts a hit (touches are batched
    per second, so each key gets one load's worth)."""
    tier = harness.open()
    harness.store(tier, 1, 0, 2)
    assert tier.store is not None

    def failing_read(*args: Any, **kwargs: Any) -> int:
        raise StoreIOError("mdb_get: Input/output error")

    monkeypatch.setattr(tier.store, "get_many_into", failing_read)
    tier.submit_load(job(2, [key(0)], [9], is_promotion=True))
    assert finish(tier, 2)[2].success is False
    monkeypatch.undo()
    tier.submit_load(job(3, [key(1)], [9], is_promotion=True))
    assert finish(tier, 3)[3].success
    namespace = tier.namespace
    tier.shutdown()  # flushes the batched touches

    connector = connector_at()
    connector.store(k(0), k(1))
    connector.load("failed", k(0), ok=False)  # the worker's copy failed: recomputed
    connector.load("served", k(1), ok=True)
    connector.runtime.close()

    for path, ns in ((harness.path, namespace), (connector.path, connector.namespace)):
        with LMDBStore.open(path, readonly=True, create=False) as store:
            hits = [meta.num_hits for i in (0, 1) if (meta := store.meta(ns, key(i)))]
        assert hits == [0, 1], path


# -- 3. the budget: the capacity less what the store's other namespaces hold ----------------


def fill_other_namespace(path: Path, capacity_bytes: int, num_bytes: int) -> None:
    with LMDBStore.open(path, capacity_bytes=capacity_bytes) as store:
        store.register_namespace("someone-else", {"model": "another"})
        store.put_many("someone-else", [(b"big", bytes(num_bytes))])


def test_both_budget_the_capacity_less_other_namespaces(
    harness: Harness, connector_at: Callable[..., Connector], tmp_path: Path
) -> None:
    fill_other_namespace(harness.path, 16 * SLOT_BYTES, 12 * SLOT_BYTES)
    tier = harness.open(capacity_bytes=16 * SLOT_BYTES)
    assert tier.pipeline.index.occupancy().capacity_bytes == 4 * SLOT_BYTES
    tier.submit_store(job(1, [key(i) for i in range(6)], range(6)))
    assert finish(tier, 1)[1].success is False  # only 4 fit
    assert [tier.lookup(key(i), CTX) for i in range(6)].count(LookupResult.HIT) == 4

    fill_other_namespace(tmp_path / "connector-store", DISK_CHUNKS * ROW_BYTES, 12 * ROW_BYTES)
    connector = connector_at()
    index = connector.runtime.index
    assert index is not None and index.stats().disk is not None
    assert index.stats().disk.capacity_bytes == 4 * ROW_BYTES


def test_both_refuse_to_start_when_other_namespaces_leave_no_room(
    harness: Harness, connector_at: Callable[..., Connector], tmp_path: Path
) -> None:
    fill_other_namespace(harness.path, 16 * SLOT_BYTES, 16 * SLOT_BYTES - 1)
    with pytest.raises(ConfigError, match=r"'capacity_bytes': other namespaces .* use 65535"):
        harness.open(capacity_bytes=16 * SLOT_BYTES)
    fill_other_namespace(tmp_path / "connector-store", DISK_CHUNKS * ROW_BYTES, 1000)
    with pytest.raises(ConfigError, match=r"^disk_bytes: other namespaces .* use 1000"):
        connector_at()


# -- 4. a damaged store file: run without it, loudly --------------------------------------


def damage(path: Path) -> bytes:
    path.mkdir(parents=True)
    garbage = b"\xff" * 16384  # not an LMDB file any more
    (path / "data.mdb").write_bytes(garbage)
    return garbage


def test_a_damaged_store_runs_without_its_disk_tier_in_both(
    harness: Harness, connector_at: Callable[..., Connector], tmp_path: Path
) -> None:
    garbage = damage(harness.path)
    tier = harness.open()  # no ConfigError: the engine starts
    assert tier.store is None and tier.lookup(key(0), CTX) is LookupResult.MISS
    tier.submit_store(job(1, [key(0)], [0]))
    tier.submit_load(job(2, [key(0)], [1], is_promotion=True))
    results = finish(tier, 1, 2)
    assert [(r.success, r.transfer_bytes) for r in results.values()] == [(False, 0)] * 2

    damage(tmp_path / "connector-store")
    connector = connector_at()
    assert connector.runtime.store is None and not connector.runtime.startup_facts()["has_disk"]
    assert connector.runtime.index is not None and connector.runtime.index.stats().disk is None

    for read, path in (
        (lambda name, **kw: metric(tier, name, **kw), harness.path),
        (connector.metric, connector.path),
    ):
        assert read("kvstore_io_errors_total", op="open") == 1
        assert read("kvstore_tier_up", tier="disk") == 0
        assert (path / "data.mdb").read_bytes() == garbage  # left as it was, for inspection


# -- 5. option parsing: one set of rules ------------------------------------------------------


def parse_connector(key_name: str, value: object) -> None:
    extra: dict[str, object] = {key_name: value}
    if key_name == "disk_path":
        extra["disk_bytes"] = "1GiB"
    KVStoreConfig.from_extra_config(extra)


def parse_tier(key_name: str, value: object) -> None:
    options: dict[str, object] = {"path": "/tmp/kvstore-tier", "capacity_bytes": "1GiB"}
    LMDBTierOptions.from_options(options | {key_name: value})


# (the connector's key, LMDBTier's key, a value, the error it gets; None: accepted)
CASES = [
    ("shutdown_timeout_s", "shutdown_timeout_s", "2.5", None),
    ("shutdown_timeout_s", "shutdown_timeout_s", "nan", "expected a finite number"),
    ("shutdown_timeout_s", "shutdown_timeout_s", float("inf"), "expected a finite number"),
    ("shutdown_timeout_s", "shutdown_timeout_s", "1e999", "expected a finite number"),
    ("audit_loads", "enable_kv_events", "true", None),
    ("audit_loads", "enable_kv_events", "0", None),
    ("audit_loads", "enable_kv_events", "yes", "expected true or false"),
    ("disk_path", "path", "/tmp/a\0b", "cannot contain a NUL character"),
    ("disk_path", "path", "", "expected a non-empty string"),
    ("metrics_host", "metrics_host", "", "expected a non-empty string"),
    ("cpu_bytes", "capacity_bytes", "1.5GiB", None),
    ("cpu_bytes", "capacity_bytes", "lots", r"expected a size in bytes \(e.g. 4294967296"),
    ("metrics_port", "metrics_port", "http", "expected an integer"),
    ("cpu_byte", "capacity_byte", 1, r"unknown .* \(did you mean '(cpu|capacity)_bytes'\?\)"),
]


@pytest.mark.parametrize(("connector_key", "tier_key", "value", "error"), CASES)
def test_both_parse_option_values_by_the_same_rules(
    connector_key: str, tier_key: str, value: object, error: str | None
) -> None:
    for parse, key_name in ((parse_connector, connector_key), (parse_tier, tier_key)):
        if error is None:
            parse(key_name, value)
        else:
            with pytest.raises(ConfigError, match=error):
                parse(key_name, value)
