"""`kvstore serve STORE`: a metrics endpoint for a store, without an engine.

Each scrape reads the store's occupancy in one short read transaction (LMDB readers never block
a live engine writing the same store).
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Annotated

import typer
from prometheus_client import CollectorRegistry
from rich.console import Console
from rich.markup import escape

from kvstore.cli.app import app
from kvstore.metrics import (
    MetricsServer,
    StoreCollector,
    register_build_info,
    start_metrics_server,
    store_snapshot,
)
from tiers.errors import TierError
from tiers.lmdb import LMDBStore

__all__ = ["StoreExporter", "serve", "serve_store"]

DEFAULT_PORT = 9401


@dataclass(frozen=True, slots=True)
class StoreExporter:
    """A store opened read-only and its exporter; `close()` stops the server, then the store."""

    store: LMDBStore
    server: MetricsServer
    registry: CollectorRegistry

    @property
    def url(self) -> str:
        return self.server.url

    def close(self) -> None:
        try:
            self.server.close()
        finally:
            self.store.close()


def serve_store(path: Path, *, port: int, host: str = "127.0.0.1") -> StoreExporter:
    """Open the store at `path` read-only and serve its metrics (port 0 picks a free one)."""
    store = LMDBStore.open(path, readonly=True, create=False)
    try:
        registry = CollectorRegistry()
        registry.register(StoreCollector(lambda: store_snapshot(store)))
        register_build_info(registry)
        server = start_metrics_server(port, host, registry=registry)
    except BaseException:
        store.close()
        raise
    return StoreExporter(store=store, server=server, registry=registry)


@app.command()
def serve(
    store: Annotated[Path, typer.Argument(help="The store directory (holds data.mdb).")],
    port: Annotated[
        int, typer.Option(min=0, max=65535, help="Port to listen on (0 = any free port).")
    ] = DEFAULT_PORT,
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    duration_s: Annotated[
        float | None,
        typer.Option("--duration-s", min=0.0, help="Stop after this many seconds (default: run)."),
    ] = None,
) -> None:
    """Serve Prometheus metrics for a store (entries, bytes, capacity, file size, namespaces)."""
    err = Console(stderr=True, soft_wrap=True, highlight=False)
    try:
        exporter = serve_store(store, port=port, host=host)
    except TierError as exc:
        err.print(f"[red]error:[/red] {escape(str(exc))}")
        raise typer.Exit(1) from exc
    except OSError as exc:  # the port is taken, or the host is not an address of this machine
        where = f"{escape(host)}:{port} (--host/--port)"
        err.print(f"[red]error:[/red] cannot listen on {where}: {exc.strerror or exc}")
        raise typer.Exit(1) from exc
    stop = threading.Event()
    err.print(f"serving metrics for {store} on {exporter.url}")
    try:
        with _stop_on_signals(stop):
            stop.wait(duration_s)
    finally:
        exporter.close()


@contextmanager
def _stop_on_signals(stop: threading.Event) -> Iterator[None]:
    """While inside, SIGTERM and SIGINT set `stop` (main thread only; handlers restored)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: FrameType | None) -> None:
        stop.set()

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
