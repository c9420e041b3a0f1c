"""The soak's parts (scenario 6): the OpenAI server with kvstore, a client, a sampler, a slope.

`OpenAIServer` runs `python -m vllm.entrypoints.openai.api_server` on the tiny model with
`--kv-transfer-config` (kvstore's metrics on their own port) in its own session, and stops it.
`process_tree` and `sample_process` read RSS and open file descriptors from /proc (the server
and its EngineCore child, where kvstore's scheduler and worker halves live). `scrape` reads a
Prometheus text page into {`name{labels}`: value}. `slope_per_min` is the least-squares slope
of a series (units per minute).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from kvstore.tiny_model import TinyLlamaSpec
from reliability.engines import CHUNK_BYTES, CHUNK_TOKENS, flat_samples

__all__ = [
    "ROLES",
    "OpenAIServer",
    "ProcessSample",
    "Target",
    "growth_per_1k",
    "process_tree",
    "sample_process",
    "scrape",
    "slope_per_min",
]


class OpenAIServer:
    """`vllm serve` (as `python -m vllm.entrypoints.openai.api_server`) with kvstore."""

    def __init__(
        self, model_dir: str, port: int, extra: dict[str, Any] | None, log_path: Path
    ) -> None:
        """`extra`: kvstore's kv_connector_extra_config (None: the server without kvstore)."""
        transfer = {
            "kv_connector": "KVStoreConnector",
            "kv_connector_module_path": "kvstore.vllm",
            "kv_role": "kv_both",
            "kv_connector_extra_config": extra,
        }
        command = [
            sys.executable, "-m", "vllm.entrypoints.openai.api_server",
            "--model", model_dir, "--port", str(port), "--host", "127.0.0.1",
            "--skip-tokenizer-init", "--dtype", TinyLlamaSpec().dtype, "--max-model-len", "1024",
            "--enforce-eager", "--block-size", str(CHUNK_TOKENS),
            "--kv-cache-memory-bytes", str(48 * CHUNK_BYTES),
        ]  # fmt: skip
        if extra is not None:
            command += ["--kv-transfer-config", json.dumps(transfer)]
        self.port = port
        self.model = model_dir
        self.log_path = log_path
        self._log = log_path.open("wb")
        env = dict(os.environ, HF_HUB_OFFLINE="1")
        self.proc = subprocess.Popen(
            command, stdout=self._log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )

    def wait_healthy(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=5):
                    return
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    tail = self.log_path.read_text(errors="replace")[-1500:]
                    raise RuntimeError(f"the OpenAI server did not come up: {tail}") from None
                time.sleep(0.5)

    def complete(self, prompt: Sequence[int], max_tokens: int) -> list[int]:
        body = json.dumps(
            {
                "model": self.model,
                "prompt": list(prompt),
                "max_tokens": max_tokens,
                "temperature": 0,
                "ignore_eos": True,  # as the reference engine: always max_tokens tokens
                "return_token_ids": True,
            }
        ).encode()
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.port}/v1/completions",
            body,
            {"content-type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=120) as response:
            data: dict[str, Any] = json.loads(response.read())
        return list(data["choices"][0]["token_ids"])

    def stop(self, timeout_s: float = 60.0) -> int | None:
        """SIGTERM, then SIGKILL past `timeout_s`; the exit status (None if killed). Stopping a
        stopped server returns its status again."""
        code: int | None = None
        if self._log.closed:
            return self.proc.returncode
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                code = self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        else:
            code = self.proc.returncode
        self._log.close()
        return code


def process_tree(pid: int) -> list[int]:
    """`pid` and its descendants (from /proc/*/stat), parents first."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    tree, todo = [], [pid]
    while todo:
        current = todo.pop(0)
        tree.append(current)
        todo.extend(sorted(children.get(current, ())))
    return tree


@dataclass(frozen=True, slots=True)
class ProcessSample:
    pid: int
    name: str
    rss_bytes: int
    num_fds: int


def sample_process(pid: int) -> ProcessSample | None:
    """RSS and open descriptors of `pid` (None once it is gone)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        num_fds = len(os.listdir(f"/proc/{pid}/fd"))
        name = Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return None
    rss_kib = next(
        (int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:")), 0
    )
    return ProcessSample(pid, name, rss_kib * 1024, num_fds)


def scrape(port: int) -> dict[str, float]:
    """The counters and gauges of a /metrics page, by `name{labels}` (`flat_samples`)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    return flat_samples(text_string_to_metric_families(text))


def slope_per_min(times_s: Sequence[float], values: Sequence[float]) -> float:
    """Least-squares slope of `values` over `times_s`, per minute (0 for < 2 points)."""
    n = len(times_s)
    if n < 2:
        return 0.0
    mean_t, mean_v = sum(times_s) / n, sum(values) / n
    var = sum((t - mean_t) ** 2 for t in times_s)
    if var == 0:
        return 0.0
    cov = sum((t - mean_t) * (v - mean_v) for t, v in zip(times_s, values, strict=True))
    return cov / var * 60.0


_SAMPLED_GAUGES = (
    "kvstore_tier_entries",
    "kvstore_queue_depth",
    "kvstore_cpu_used",
    "kvstore_pipeline_inflight",
)

ROLES = {"VLLM::EngineCor": "engine core", "VLLM::Worker": "worker"}
"""The engine's processes by name (`comm`); the server's own process is the "api server"."""

Point = tuple[float, float]


@dataclass(slots=True)
class Target:
    """One server under load: its clients, what they got, and the series sampled from it."""

    label: str
    server: OpenAIServer
    completions: list[tuple[list[int], list[int]]] = field(default_factory=list)
    completion_times_s: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    rss_mb: dict[str, list[Point]] = field(default_factory=dict)
    fds: dict[str, list[Point]] = field(default_factory=dict)
    gauges: dict[str, list[Point]] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)
    _start_s: float = 0.0
    exit_code: int | None = None  # the server's, once stopped

    def start_clients(
        self, pool: list[list[int]], num_clients: int, seed: int, max_tokens: int
    ) -> None:
        self._start_s = time.monotonic()
        for index in range(num_clients):
            thread = threading.Thread(
                target=self._client, args=(pool, seed + index, max_tokens), daemon=True
            )
            thread.start()
            self._threads.append(thread)

    def _client(self, pool: list[list[int]], seed: int, max_tokens: int) -> None:
        rng = random.Random(seed)
        while not self._stop.is_set():
            prompt = rng.choice(pool)
            try:
                tokens = self.server.complete(prompt, max_tokens)
            except OSError as exc:
                self.errors.append(f"{type(exc).__name__}: {exc}")
                time.sleep(1.0)
                continue
            self.completions.append((prompt, tokens))
            self.completion_times_s.append(time.monotonic() - self._start_s)

    def stop_clients(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(150)

    def sample(self, t: float, metrics_port: int | None) -> None:
        root = self.server.proc.pid
        for pid in process_tree(root):
            sample = sample_process(pid)
            role = "api server" if pid == root else ROLES.get(sample.name if sample else "")
            if sample is not None and role is not None:
                self.rss_mb.setdefault(role, []).append((t, sample.rss_bytes / 1e6))
                self.fds.setdefault(role, []).append((t, sample.num_fds))
        if metrics_port is None:
            return
        try:
            metrics = scrape(metrics_port)
        except OSError:
            return
        for name, value in metrics.items():
            if name.startswith(_SAMPLED_GAUGES):
                self.gauges.setdefault(name, []).append((t, value))

    def scrape_final(self, metrics_port: int) -> dict[str, float]:
        return scrape(metrics_port)

    def fd_span(self, warmup_s: float) -> dict[str, tuple[int, int]]:
        """Per role: open descriptors at the end of the warm-up, and the most seen after."""
        spans = {}
        for role, points in self.fds.items():
            window = [int(v) for t, v in points if t >= warmup_s]
            if window:
                spans[role] = (window[0], max(window))
        return spans

    def gauge_slopes(self, warmup_s: float) -> dict[str, float]:
        return {name: round(_slope(points, warmup_s), 3) for name, points in self.gauges.items()}


def _slope(points: list[Point], warmup_s: float) -> float:
    window = [(t, v) for t, v in points if t >= warmup_s]
    return slope_per_min([t for t, _ in window], [v for _, v in window])


def growth_per_1k(target: Target, warmup_s: float) -> dict[str, tuple[float, float]]:
    """Per role: the RSS slope after warm-up in MB/min, and in MB per 1000 requests."""
    times = [t for t in target.completion_times_s if t >= warmup_s]
    span_min = (max(times) - warmup_s) / 60 if times else 0.0
    per_min = len(times) / span_min if span_min > 0 else 0.0
    growth = {}
    for role, points in target.rss_mb.items():
        slope = _slope(points, warmup_s)
        growth[role] = (slope, slope / per_min * 1000 if per_min else 0.0)
    return growth
