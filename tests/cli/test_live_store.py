"""The read commands run beside another process writing the same store heavily, without errors."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from .helpers import TP1, TP2, BuiltStore, run, run_json

# Puts 16 chunks of 16 KiB a transaction, deletes the oldest batch beyond 12, touches TP1.
WRITER = """
import os, sys
from pathlib import Path
from tiers.lmdb import LMDBStore

path, stop, tp1 = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
with LMDBStore.open(path, capacity_bytes=int(sys.argv[4])) as store:
    store.register_namespace("live-writer", {"model": "writer"})
    touched = list(store.iter_keys(tp1))
    batches, n = [], 0
    print("ready", flush=True)
    while not stop.exists():
        batch = [(i.to_bytes(8, "big") + bytes(24), os.urandom(16384)) for i in range(n, n + 16)]
        n += 16
        store.put_many("live-writer", batch)
        batches.append([key for key, _ in batch])
        if len(batches) > 12:
            store.delete_many("live-writer", batches.pop(0))
        store.touch_many(tp1, touched)
    print(f"done {n}", flush=True)
"""


def test_read_commands_beside_a_heavy_writer(built: BuiltStore, tmp_path: Path) -> None:
    stop = tmp_path / "stop"
    args = [str(built.path), str(stop), TP1, str(8 << 20)]
    writer = subprocess.Popen(
        [sys.executable, "-c", WRITER, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert writer.stdout is not None
        assert writer.stdout.readline().strip() == "ready", writer.stderr
        num_rounds = 0
        deadline = time.monotonic() + 4.0
        while time.monotonic() < deadline or num_rounds < 3:
            stat = run_json("stat", built.path)
            assert stat["num_namespaces"] == 4
            listing = run_json("ls", built.path, "--sort", "hits", "--limit", "50")
            assert listing["chunks"]
            verified = run_json("verify", built.path)
            assert verified["num_corrupt"] == 0
            assert verified["num_checked"] > 10
            shown = run_json("show", built.path, built.keys[TP1][num_rounds % 4].hex()[:8])
            assert shown["chunk"]["checksum_state"] == "ok"
            if num_rounds == 1:
                assert run("rm", built.path, built.keys[TP2][0].hex()[:8], "--yes").exit_code == 0
            assert run("ls", built.path, "--namespace", "live-writer").exit_code == 0
            num_rounds += 1
    finally:
        stop.touch()
        out, err = writer.communicate(timeout=60)
    assert writer.returncode == 0, err
    num_written = int(out.split()[-1])
    assert num_written > 16 * num_rounds, (out, num_rounds)
    assert run_json("verify", built.path)["num_corrupt"] == 0
