"""Scenario 7's checks: what kvstore exposes to the network and to other users of the machine.

Each check returns a `Check` (name, passed, detail) and never raises for a failed expectation,
so the scenario can count them and the tests can assert them one by one. Listening sockets are
read from `/proc/net/tcp{,6}` (what the kernel says is bound), not from the code's own idea.
"""

from __future__ import annotations

import ast
import asyncio
import contextlib
import inspect
import os
import socket
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from prometheus_client import CollectorRegistry

__all__ = ["CHECKS", "Check", "code_execution_calls", "listening_hosts", "umask"]

_ROOT = Path(__file__).resolve().parent.parent
_LISTEN = "0A"


@dataclass(frozen=True, slots=True)
class Check:
    name: str
    passed: bool
    detail: str = ""


def _hex_to_host(text: str) -> str:
    raw = bytes.fromhex(text)
    if len(raw) == 4:
        return socket.inet_ntop(socket.AF_INET, raw[::-1])
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, 16, 4))
    return socket.inet_ntop(socket.AF_INET6, words)


def listening_hosts(port: int) -> set[str]:
    """The local addresses with a TCP socket LISTENing on `port`, per the kernel."""
    hosts: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(FileNotFoundError), open(table) as lines:
            for line in list(lines)[1:]:
                fields = line.split()
                address, state = fields[1], fields[3]
                host, port_hex = address.rsplit(":", 1)
                if state == _LISTEN and int(port_hex, 16) == port:
                    hosts.add(_hex_to_host(host))
    return hosts


def _only_loopback(port: int) -> Check:
    hosts = listening_hosts(port)
    ok = bool(hosts) and hosts <= {"127.0.0.1", "::1"}
    return Check(f"port {port} listens on loopback only", ok, f"listening on {sorted(hosts)}")


@contextlib.contextmanager
def umask(mask: int) -> Iterator[None]:
    previous = os.umask(mask)
    try:
        yield
    finally:
        os.umask(previous)


# -- endpoints ------------------------------------------------------------------------------------


def metrics_server_defaults_to_loopback() -> Check:
    from kvstore.metrics import start_metrics_server

    with start_metrics_server(0, registry=CollectorRegistry()) as server:
        check = _only_loopback(server.port)
    default = inspect.signature(start_metrics_server).parameters["host"].default
    ok = check.passed and default == "127.0.0.1"
    return Check("metrics server binds 127.0.0.1 by default", ok, f"{check.detail}; host={default}")


def config_defaults_expose_nothing() -> Check:
    from kvstore.config import KVStoreConfig

    config = KVStoreConfig.from_extra_config({})
    exposed = {
        "metrics_port": config.metrics_port,
        "events_endpoint": config.events_endpoint,
        "events_replay_endpoint": config.events_replay_endpoint,
    }
    ok = all(value is None for value in exposed.values()) and config.metrics_host == "127.0.0.1"
    detail = f"{exposed}, metrics_host={config.metrics_host}"
    return Check("kv_connector_extra_config defaults open no socket", ok, detail)


def serve_defaults_to_loopback() -> Check:
    from kvstore.cli.serve import serve, serve_store
    from reliability.damage import small_store

    defaults = {
        "kvstore serve --host": inspect.signature(serve).parameters["host"].default,
        "serve_store(host=)": inspect.signature(serve_store).parameters["host"].default,
    }
    with small_store(2, 64) as path:
        exporter = serve_store(path, port=0)
        try:
            check = _only_loopback(exporter.server.port)
        finally:
            exporter.close()
    ok = check.passed and set(defaults.values()) == {"127.0.0.1"}
    return Check("kvstore serve binds 127.0.0.1 by default", ok, f"{check.detail}; {defaults}")


def zmq_sink_listens_only_where_told() -> Check:
    """A non-wildcard events endpoint is connected to (vLLM's rule), never listened on; the
    replay socket listens only on the address given."""
    from kvstore.eventbus import ZMQPublisherSink
    from tests.support.net import free_port

    port = free_port()

    async def start_and_look() -> tuple[set[str], Check]:
        sink = ZMQPublisherSink(f"tcp://127.0.0.1:{port}", replay_endpoint="tcp://127.0.0.1:0")
        await sink.start()
        try:
            replay_port = int(str(sink.replay_endpoint).rsplit(":", 1)[1])
            return listening_hosts(port), _only_loopback(replay_port)
        finally:
            await sink.close()

    events_hosts, replay = asyncio.run(start_and_look())
    ok = not events_hosts and replay.passed
    detail = f"events port listened on {sorted(events_hosts)}; replay: {replay.detail}"
    return Check("ZMQ events sink listens only where told", ok, detail)


def watch_connects_without_listening() -> Check:
    from reliability.checks import run_cli
    from tests.support.net import free_port

    port = free_port()
    seen: list[set[str]] = []
    done = threading.Event()

    def look() -> None:
        while not done.wait(0.02):
            seen.append(listening_hosts(port))

    watcher = threading.Thread(target=look, daemon=True)
    watcher.start()
    try:
        result = run_cli("watch", f"tcp://127.0.0.1:{port}", "--timeout-s", "0.5", "--json")
    finally:
        done.set()
        watcher.join()
    hosts = set().union(*seen) if seen else set()
    ok = result.exit_code == 0 and not hosts
    return Check("kvstore watch connects, never listens", ok, f"exit {result.exit_code}, {hosts}")


# -- files ----------------------------------------------------------------------------------------


def _modes(path: Path) -> dict[str, str]:
    return {p.name: oct(p.stat().st_mode & 0o777) for p in (path, *sorted(path.iterdir()))}


def store_files_are_private() -> Check:
    """0700 directory and 0600 files even under umask 0, for a new directory and for an
    existing empty one."""
    from tiers.lmdb import LMDBStore

    found: dict[str, dict[str, str]] = {}
    with tempfile.TemporaryDirectory() as base, umask(0):
        existing = Path(base) / "existing"
        existing.mkdir(mode=0o777)
        for name, path in (("new", Path(base) / "new"), ("existing", existing)):
            LMDBStore.open(path, capacity_bytes=1 << 20, map_size_bytes=1 << 22).close()
            found[name] = _modes(path)
    ok = all(
        modes == {name: "0o700", "data.mdb": "0o600", "lock.mdb": "0o600"}
        for name, modes in found.items()
    )
    return Check("store directory 0700, files 0600 (umask 0)", ok, str(found))


def region_file_is_private() -> Check:
    from tiers.cpu import CPURegion

    with tempfile.TemporaryDirectory() as base, umask(0):
        region = CPURegion.create("kvstore-exposure", 2, 4096, directory=base)
        try:
            mode = oct(region.path.stat().st_mode & 0o777)
        finally:
            region.close()
    return Check("CPU region file 0600 (umask 0)", mode == "0o600", f"mode {mode}")


# -- ports in use ---------------------------------------------------------------------------------


@contextlib.contextmanager
def _busy_port() -> Iterator[int]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield int(sock.getsockname()[1])


def metrics_port_in_use_fails_fast() -> Check:
    from kvstore.config import KVStoreConfig
    from kvstore.metrics import start_metrics_server

    with _busy_port() as port:
        config = KVStoreConfig.from_extra_config({"metrics_port": port})
        start = time.monotonic()
        try:
            start_metrics_server(config.metrics_port or 0, config.metrics_host,
                                 registry=CollectorRegistry()).close()  # fmt: skip
        except OSError as exc:
            took = time.monotonic() - start
            return Check("metrics port in use fails at start", took < 5, f"{exc} ({took:.2f} s)")
    return Check("metrics port in use fails at start", False, "the server started anyway")


def events_endpoint_in_use_names_key() -> Check:
    from kvstore.config import KVStoreConfig
    from kvstore.errors import ConfigError
    from kvstore.eventbus import ZMQPublisherSink

    results = []
    with _busy_port() as port:
        for key in ("events_endpoint", "events_replay_endpoint"):
            config = KVStoreConfig.from_extra_config(
                {"events_endpoint": "tcp://*:0", key: f"tcp://*:{port}"}
            )
            sink = ZMQPublisherSink(
                config.events_endpoint or "", replay_endpoint=config.events_replay_endpoint
            )
            try:
                asyncio.run(sink.start())
            except ConfigError as exc:
                results.append((key, key in str(exc), str(exc)))
            else:
                asyncio.run(sink.close())
                results.append((key, False, "started anyway"))
    ok = all(named for _, named, _ in results)
    return Check("events endpoint in use fails naming its key", ok, str(results))


# -- formats that could run code ------------------------------------------------------------------

_CODE_LOADERS = {
    ("pickle", "load"), ("pickle", "loads"), ("pickle", "Unpickler"), ("torch", "load"),
    ("yaml", "load"), ("yaml", "unsafe_load"), ("marshal", "load"), ("marshal", "loads"),
    ("dill", "load"), ("dill", "loads"), ("cloudpickle", "load"), ("cloudpickle", "loads"),
    ("shelve", "open"), ("numpy", "load"), ("np", "load"), ("jsonpickle", "decode"),
}  # fmt: skip
_CODE_BUILTINS = {"eval", "exec", "compile", "__import__"}


def code_execution_calls(
    roots: tuple[Path, ...] = (_ROOT / "kvstore", _ROOT / "tiers"),
) -> list[str]:
    """`file:line call` for every call under `roots` that can run code from data it loads."""
    found = []
    for root in roots:
        for path in sorted(root.rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if not isinstance(node, ast.Call):
                    continue
                func = node.func
                dotted = (
                    (func.value.id, func.attr)
                    if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name)
                    else None
                )
                bare = func.id if isinstance(func, ast.Name) else None
                if dotted in _CODE_LOADERS or bare in _CODE_BUILTINS:
                    found.append(
                        f"{path.relative_to(root.parent)}:{node.lineno} {ast.unparse(func)}"
                    )
    return found


def no_format_runs_code() -> Check:
    calls = code_execution_calls()
    return Check("no stored or streamed format can run code on load", not calls, str(calls[:5]))


CHECKS: tuple[Callable[[], Check], ...] = (
    config_defaults_expose_nothing,
    metrics_server_defaults_to_loopback,
    serve_defaults_to_loopback,
    zmq_sink_listens_only_where_told,
    watch_connects_without_listening,
    store_files_are_private,
    region_file_is_private,
    metrics_port_in_use_fails_fast,
    events_endpoint_in_use_names_key,
    no_format_runs_code,
)


def runtime_ports_in_use_name_keys() -> list[Check]:
    """The engine's scheduler runtime, built without an engine (a hand-made geometry): a
    metrics port or events endpoint in use must stop `start()` with an error naming the key.
    Empty where vLLM (which `kvstore.vllm` imports) is missing."""
    try:
        from kvstore.vllm.geometry import EngineGeometry
        from kvstore.vllm.runtime import SchedulerRuntime
    except ImportError:
        return []
    from kvstore.config import KVStoreConfig

    geometry = EngineGeometry(
        engine_id=f"exposure-{os.getpid()}", model="m", kv_dtype="bfloat16",
        engine_block_size=16, hash_block_size=16, blocks_per_chunk=1, tp_size=1,
        num_engine_blocks=8, layer_names=("l0",), layer_block_bytes=(4096,), device_type="cpu",
        attention_backend="test", kv_cache_layout="NHD", hash_algo="sha256", is_hash_stable=True,
    )  # fmt: skip
    checks = []
    with _busy_port() as port, tempfile.TemporaryDirectory() as region_dir:
        for key, value in (("metrics_port", port), ("events_endpoint", f"tcp://*:{port}")):
            extra = {"cpu_bytes": 1 << 20, "region_dir": region_dir, key: value}
            runtime = SchedulerRuntime(KVStoreConfig.from_extra_config(extra), geometry)
            try:
                runtime.start()
            except Exception as exc:  # whatever it is, the check is whether it names the key
                error = f"{type(exc).__name__}: {exc}"
                checks.append(Check(f"engine start names {key} when in use", key in error, error))
            else:
                runtime.close()
                checks.append(Check(f"engine start names {key} when in use", False, "started"))
    return checks
