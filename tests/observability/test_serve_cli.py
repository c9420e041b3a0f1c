"""`kvstore serve` scrapes a real LMDB store at scrape time, beside a live writer."""

from __future__ import annotations

import re
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from typer.testing import CliRunner

from kvstore.cli import app
from kvstore.cli.serve import serve_store
from kvstore.metrics import SERVE_METRIC_NAMES
from tiers.lmdb import LMDBStore

CAPACITY_BYTES = 8 << 20
ROW_BYTES = 4096


def scrape(url: str) -> dict[str, float]:
    with urllib.request.urlopen(url, timeout=5) as response:
        text = response.read().decode()
    samples: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
            samples[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
    return samples


@pytest.fixture
def store(tmp_path: Path) -> Iterator[LMDBStore]:
    with LMDBStore.open(tmp_path / "store", capacity_bytes=CAPACITY_BYTES) as writable:
        for namespace in ("ns-a", "ns-b"):
            writable.register_namespace(namespace, {"model": namespace})
        writable.put_many("ns-a", [(bytes([i]) * 32, bytes(ROW_BYTES)) for i in range(3)])
        yield writable


def test_serve_store_reports_the_disk_tier_at_scrape_time(store: LMDBStore) -> None:
    exporter = serve_store(store.path, port=0)
    try:
        first = scrape(exporter.url)
        assert first["kvstore_tier_entries{tier=disk}"] == 3
        assert first["kvstore_tier_used_bytes{tier=disk}"] == 3 * ROW_BYTES
        assert first["kvstore_tier_capacity_bytes{tier=disk}"] == CAPACITY_BYTES
        assert first["kvstore_store_namespaces"] == 2
        assert first["kvstore_store_file_bytes"] > 0
        store.put_many("ns-b", [(bytes([9]) * 32, bytes(ROW_BYTES))])
        assert scrape(exporter.url)["kvstore_tier_entries{tier=disk}"] == 4
        names = {re.sub(r"\{.*", "", name) for name in first}
        assert names == set(SERVE_METRIC_NAMES)
    finally:
        exporter.close()


def test_the_command_serves_until_terminated(store: LMDBStore) -> None:
    kvstore = Path(sys.executable).with_name("kvstore")
    proc = subprocess.Popen(
        [str(kvstore), "serve", str(store.path), "--port", "0"],
        stderr=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline()
        match = re.search(r"(http://\S+/metrics)", line)
        assert match, line
        store.put_many("ns-a", [(bytes([7]) * 32, bytes(ROW_BYTES))])
        assert scrape(match.group(1))["kvstore_tier_entries{tier=disk}"] == 4
        proc.terminate()
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_serve_for_a_duration_in_process(store: LMDBStore) -> None:
    started = time.monotonic()
    result = CliRunner().invoke(
        app, ["serve", str(store.path), "--port", "0", "--duration-s", "0.2"]
    )
    assert result.exit_code == 0, result.output
    assert time.monotonic() - started < 10
    assert "serving metrics" in result.stderr


def test_a_path_that_is_not_a_store_exits_2(tmp_path: Path) -> None:
    """A usage error, as the README's exit codes say (it exited 1 before)."""
    result = CliRunner().invoke(app, ["serve", str(tmp_path), "--port", "0"])
    assert result.exit_code == 2
    assert "not a kvstore store" in result.stderr
    missing = CliRunner().invoke(app, ["serve", str(tmp_path / "nothing"), "--port", "0"])
    assert missing.exit_code == 2
    assert "does not exist" in missing.stderr
