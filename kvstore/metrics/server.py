"""The HTTP exporter: `/metrics` for one registry, served from a daemon thread until `close()`."""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, start_http_server

from kvstore.errors import ConfigError

__all__ = ["MetricsServer", "serve_configured_metrics", "start_metrics_server"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class MetricsServer:
    """A running exporter. `port` is the bound port (useful with port 0)."""

    host: str
    port: int
    _server: WSGIServer
    _thread: threading.Thread

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/metrics"

    @property
    def target(self) -> str:
        """`host:port`, as a Prometheus scrape config names it."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    def close(self, timeout_s: float = 5.0) -> None:
        """Stop serving, close the socket and join the thread (idempotent)."""
        if self._thread.is_alive():
            self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            logger.warning("metrics server thread did not stop within %.1f s", timeout_s)

    def __enter__(self) -> MetricsServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def start_metrics_server(
    port: int, host: str = "127.0.0.1", *, registry: CollectorRegistry
) -> MetricsServer:
    """Serve `registry` on `http://host:port/metrics` (port 0 picks a free one)."""
    server, thread = start_http_server(port, addr=host, registry=registry)
    bound_port = int(server.server_port)
    logger.info("serving metrics on http://%s:%d/metrics", host, bound_port)
    return MetricsServer(host=host, port=bound_port, _server=server, _thread=thread)


def serve_configured_metrics(
    port: int | None, host: str, *, registry: CollectorRegistry, port_label: str
) -> MetricsServer | None:
    """The endpoint an integration's config asks for (None without a port). A port that
    cannot be bound stops the start with a ConfigError naming `port_label` (the key, as the
    integration's errors name it)."""
    if port is None:
        return None
    try:
        return start_metrics_server(port, host=host, registry=registry)
    except OSError as exc:
        raise ConfigError(
            f"{port_label}: cannot listen on {host}:{port}: {exc.strerror or exc}"
        ) from exc
