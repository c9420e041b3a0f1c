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
from typing import TYPE_CHECKING, Annotated

import typer

from kvstore.cli._common import EXIT_FAILURE, cli_errors, err_console, fail, open_store
from kvstore.cli.app import app

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from kvstore.metrics import MetricsServer
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


class ListenError(Exception):
    """The metrics endpoint could not bind (not an OSError: `cli_errors` must not take it for
    a store's I/O error)."""


def serve_store(path: Path, *, port: int, host: str = "127.0.0.1") -> StoreExporter:
    """Open the store at `path` read-only and serve its metrics (port 0 picks a free one).

    A path that is not a store raises StoreNotFoundError (exit 2, as for every command)."""
    from prometheus_client import CollectorRegistry

    from kvstore.metrics import (
        StoreCollector,
        register_build_info,
        start_metrics_server,
        store_snapshot,
    )

    store = open_store(path)
    try:
        registry = CollectorRegistry()
        registry.register(StoreCollector(lambda: store_snapshot(store)))
        register_build_info(registry)
        try:
            server = start_metrics_server(port, host, registry=registry)
        except OSError as exc:  # the port is taken, or the host is not an address here
            raise ListenError(f"cannot listen on {host}:{port} (--host/--port): "
                              f"{exc.strerror or exc}") from exc  # fmt: skip
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
    try:
        with cli_errors():  # not a store: exit 2; a store LMDB cannot read: exit 1
            exporter = serve_store(store, port=port, host=host)
    except ListenError as exc:
        fail(str(exc), EXIT_FAILURE)
    stop = threading.Event()
    err_console().print(f"serving metrics for {store} on {exporter.url}")
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
