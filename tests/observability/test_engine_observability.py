"""Observability of a real engine run: the ZMQ stream decodes with vLLM's own classes, and every
dashboard query returns data from a real Prometheus scraping the engine's metrics endpoint."""

from __future__ import annotations

import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import msgspec
import pytest
import zmq

from kvstore.tiny_model import TinyLlamaSpec
from kvstore.vllm.engine import engine, generate_greedy, kv_transfer_config, scheduler_connector
from tests.support.connector import drain, kvstore_summary
from tests.support.net import free_port
from tests.support.prometheus import evaluate_dashboard, run_prometheus

pytestmark = pytest.mark.engine

CHUNK_BYTES = TinyLlamaSpec().kv_bytes_per_token * 32  # one 32-token block, every layer


def _prompt(i: int, length: int = 200) -> list[int]:
    return [(37 * j + 11 * i) % 500 + 5 for j in range(length)]


class Subscriber:
    """A stock vLLM subscriber: SUB socket, frames (topic, seq, payload), vLLM's KVEventBatch."""

    def __init__(self, endpoint: str) -> None:
        from vllm.distributed.kv_events import KVEventBatch

        self._decoder = msgspec.msgpack.Decoder(type=KVEventBatch)
        self._context = zmq.Context()
        self._socket = self._context.socket(zmq.SUB)
        self._socket.setsockopt(zmq.SUBSCRIBE, b"")
        self._socket.connect(endpoint)
        self.batches: list[Any] = []
        self.seqs: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        poller = zmq.Poller()
        poller.register(self._socket, zmq.POLLIN)
        while not self._stop.is_set():
            if poller.poll(100):
                _topic, seq, payload = self._socket.recv_multipart()
                self.seqs.append(int.from_bytes(seq, "big"))
                self.batches.append(self._decoder.decode(payload))

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._socket.close(0)
        self._context.term()

    def counts(self) -> Counter[tuple[str, str]]:
        out: Counter[tuple[str, str]] = Counter()
        for batch in self.batches:
            for event in batch.events:
                out[(type(event).__name__, event.medium)] += len(event.block_hashes)
        return out


def test_zmq_stream_matches_the_index(tiny_model_dir: Path, tmp_path: Path) -> None:
    port = free_port()
    subscriber = Subscriber(f"tcp://127.0.0.1:{port}")
    config = kv_transfer_config(
        cpu_bytes=8 * CHUNK_BYTES,
        disk_path=str(tmp_path / "store"),
        disk_bytes=10 * CHUNK_BYTES,
        events_endpoint=f"tcp://*:{port}",  # vLLM's rule: a wildcard endpoint binds
        events_log=str(tmp_path / "events.jsonl"),
    )
    try:
        with engine(tiny_model_dir, kv_transfer=config) as llm:
            time.sleep(0.5)  # PUB/SUB: let the subscription reach the publisher
            for i in range(4):
                generate_greedy(llm, [_prompt(i)])
                llm.reset_prefix_cache()
            generate_greedy(llm, [_prompt(0)])
            drain(llm)
            summary = kvstore_summary(llm)
            registry = scheduler_connector(llm).runtime.registry
        deadline = time.monotonic() + 10
        expected = {
            ("BlockStored", "CPU"): summary["tiers"]["cpu"]["stored_chunks"],
            ("BlockStored", "STORAGE"): summary["tiers"]["disk"]["stored_chunks"],
        }
        while time.monotonic() < deadline and any(
            subscriber.counts()[k] < v for k, v in expected.items()
        ):
            time.sleep(0.1)
    finally:
        subscriber.close()
    counts = subscriber.counts()

    def removed(tier: str) -> float:
        return sum(
            s.value
            for m in registry.collect()
            if m.name == "kvstore_removed_chunks"
            for s in m.samples
            if s.name.endswith("_total") and s.labels["tier"] == tier
        )

    assert counts[("BlockStored", "CPU")] == expected[("BlockStored", "CPU")] > 0
    assert counts[("BlockStored", "STORAGE")] == expected[("BlockStored", "STORAGE")] > 0
    assert counts[("BlockRemoved", "CPU")] == removed("cpu") > 0
    assert counts[("BlockRemoved", "STORAGE")] == removed("disk") > 0
    assert subscriber.seqs == sorted(subscriber.seqs)
    log_lines = (tmp_path / "events.jsonl").read_text().splitlines()
    assert len(log_lines) == sum(len(b.events) for b in subscriber.batches)


@pytest.mark.prometheus
def test_every_dashboard_query_has_data_from_a_real_engine(
    tiny_model_dir: Path, tmp_path: Path, prometheus_binary: Path
) -> None:
    config = kv_transfer_config(
        cpu_bytes=12 * CHUNK_BYTES,
        disk_path=str(tmp_path / "store"),
        disk_bytes=64 * CHUNK_BYTES,
        metrics_port=0,  # any free port, read back below (no race with other processes)
    )
    stop = threading.Event()
    with engine(tiny_model_dir, kv_transfer=config) as llm:
        target = scheduler_connector(llm).runtime.metrics_server.target

        def traffic() -> None:
            i = 0
            while not stop.is_set():
                # each prompt twice in a row (a CPU hit), back after 4 others (a disk hit)
                generate_greedy(llm, [_prompt(i // 2 % 5)], max_tokens=4)
                llm.reset_prefix_cache()  # every repeat must come from kvstore
                i += 1

        thread = threading.Thread(target=traffic, daemon=True)
        thread.start()
        try:
            with run_prometheus([target], binary=prometheus_binary) as prom:
                prom.wait_for_scrapes(6, timeout_s=90)
                checks = evaluate_dashboard(prom)
                hit_cpu = prom.query('sum(kvstore_hit_tokens_total{tier="cpu"})')
                hit_disk = prom.query('sum(kvstore_hit_tokens_total{tier="disk"})')
        finally:
            stop.set()
            thread.join(60)
    missing = [c.expr for c in checks if not c.has_data]
    assert not missing, missing
    assert len(checks) >= 10
    assert float(hit_cpu[0]["value"][1]) > 0
    assert float(hit_disk[0]["value"][1]) > 0
