"""A real Prometheus for tests: find or install it, run it against targets, query it, and check
that every query of the Grafana dashboard returns data.

    with run_prometheus(["127.0.0.1:9400"]) as prom:
        prom.wait_for_scrapes(2)
        checks = evaluate_dashboard(prom)
    assert not [c for c in checks if not c.is_ok]

or in one call, for any metrics endpoint (`check_dashboard_against(["127.0.0.1:9400"])`). No
pytest here: a missing Prometheus raises `PrometheusUnavailable`, which tests turn into a skip.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.support.apt import apt_install
from tests.support.net import free_port

__all__ = [
    "DEFAULT_DASHBOARD",
    "DEFAULT_VARIABLES",
    "PrometheusError",
    "PrometheusServer",
    "PrometheusUnavailable",
    "QueryCheck",
    "check_dashboard_against",
    "dashboard_queries",
    "ensure_prometheus",
    "evaluate_dashboard",
    "metric_names_in",
    "run_prometheus",
]

DEFAULT_DASHBOARD = Path(__file__).resolve().parents[2] / "grafana" / "dashboards" / "kvstore.json"

DEFAULT_VARIABLES: Mapping[str, str] = {
    "__rate_interval": "30s",
    "__interval": "15s",
    "__interval_ms": "15000",
    "__range": "5m",
    "__range_s": "300",
    "__range_ms": "300000",
}
"""Grafana's built-in variables, as Grafana would fill them for a 1 s scrape interval."""

_install_lock = threading.Lock()


class PrometheusUnavailable(RuntimeError):
    """No Prometheus binary, and none could be installed (the message says why)."""


class PrometheusError(RuntimeError):
    """Prometheus failed to start, to scrape, or to answer a query."""


def ensure_prometheus(*, install: bool = True) -> Path:
    """The `prometheus` binary: `$KVSTORE_PROMETHEUS_BIN`, on PATH, or Debian's package installed
    with apt-get when running as root. Raises PrometheusUnavailable otherwise."""
    override = os.environ.get("KVSTORE_PROMETHEUS_BIN")
    if override:
        if not os.access(override, os.X_OK):
            raise PrometheusUnavailable(f"KVSTORE_PROMETHEUS_BIN={override} is not executable")
        return Path(override)
    with _install_lock:
        found = shutil.which("prometheus")
        if found:
            return Path(found)
        if not install:
            raise PrometheusUnavailable("prometheus is not on PATH (installing was not allowed)")
        problem = apt_install("prometheus", "KVSTORE_PROMETHEUS_BIN")
        found = shutil.which("prometheus")
        if found is None:
            raise PrometheusUnavailable(problem or "prometheus installed but not on PATH")
        return Path(found)


@dataclass(frozen=True, slots=True)
class PrometheusServer:
    """A running Prometheus: its base URL and a small client for the HTTP API."""

    url: str
    job: str
    log_path: Path

    def api(self, path: str, **params: str) -> Any:
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        try:
            with urllib.request.urlopen(f"{self.url}{path}{query}", timeout=10) as response:
                body = json.load(response)
        except urllib.error.HTTPError as exc:
            body = json.loads(exc.read() or b"{}")
            raise PrometheusError(f"{path} {params}: {exc.code} {body.get('error')}") from exc
        if body.get("status") != "success":
            raise PrometheusError(f"{path} {params}: {body}")
        return body["data"]

    def query(self, promql: str) -> list[dict[str, Any]]:
        """An instant query; the result list (each with `metric` and `value`)."""
        data = self.api("/api/v1/query", query=promql)
        result = data["result"]
        if data["resultType"] == "scalar":  # a bare number: wrap it like a vector sample
            return [{"metric": {}, "value": result}]
        return list(result)

    def targets(self) -> list[dict[str, Any]]:
        return list(self.api("/api/v1/targets")["activeTargets"])

    def wait_until_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as response:
                    if response.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.1)
        raise PrometheusError(f"not ready after {timeout_s} s; log: {self._log_tail()}")

    def wait_for_scrapes(self, num_scrapes: int = 2, timeout_s: float = 60.0) -> None:
        """Until every target was scraped successfully at least `num_scrapes` times."""
        promql = f'sum_over_time(up{{job="{self.job}"}}[10m])'
        deadline = time.monotonic() + timeout_s
        while True:
            targets = self.targets()
            result = self.query(promql)
            counts = [float(sample["value"][1]) for sample in result]
            if targets and len(counts) == len(targets) and min(counts) >= num_scrapes:
                return
            if time.monotonic() > deadline:
                health = [(t["scrapeUrl"], t["health"], t.get("lastError")) for t in targets]
                raise PrometheusError(
                    f"targets not scraped {num_scrapes} times in {timeout_s} s: {health}"
                )
            time.sleep(0.25)

    def _log_tail(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-2000:]
        except OSError:
            return "(no log)"


def _config(targets: Sequence[str], job: str, scrape_interval_s: float) -> str:
    interval = f"{int(scrape_interval_s * 1000)}ms"
    return json.dumps(  # JSON is YAML
        {
            "global": {"scrape_interval": interval, "evaluation_interval": interval},
            "scrape_configs": [
                {
                    "job_name": job,
                    "scrape_interval": interval,
                    "scrape_timeout": interval,
                    "static_configs": [{"targets": list(targets)}],
                }
            ],
        },
        indent=2,
    )


@contextmanager
def run_prometheus(
    targets: Sequence[str],
    *,
    scrape_interval_s: float = 1.0,
    job: str = "kvstore",
    binary: Path | None = None,
    ready_timeout_s: float = 60.0,
) -> Iterator[PrometheusServer]:
    """Run Prometheus on a free port scraping `targets` (`host:port`, path /metrics).

    Waits until it is ready; stops it (terminate, then kill after 10 s) and removes its data on
    exit.
    """
    exe = binary or ensure_prometheus()
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="kvstore-prometheus-") as tmp:
        workdir = Path(tmp)
        config = workdir / "prometheus.yml"
        config.write_text(_config(targets, job, scrape_interval_s))
        log_path = workdir / "prometheus.log"
        cmd = [
            str(exe),
            f"--config.file={config}",
            f"--storage.tsdb.path={workdir / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--storage.tsdb.retention.time=1h",
            "--log.level=warn",
        ]
        with log_path.open("wb") as log:
            process = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=workdir)
        server = PrometheusServer(url=f"http://127.0.0.1:{port}", job=job, log_path=log_path)
        try:
            if process.poll() is not None:
                raise PrometheusError(f"exited at start: {server._log_tail()}")
            server.wait_until_ready(ready_timeout_s)
            yield server
        finally:
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


# -- the dashboard ----------------------------------------------------------------------------

_VARIABLE = re.compile(r"\$\{(\w+)(?::\w+)?\}|\[\[(\w+)\]\]|\$(\w+)")


def _panels(panels: Sequence[Mapping[str, Any]]) -> Iterator[Mapping[str, Any]]:
    for panel in panels:
        yield panel
        yield from _panels(panel.get("panels", ()))  # collapsed rows hold their panels


def dashboard_queries(
    path: Path = DEFAULT_DASHBOARD, variables: Mapping[str, str] | None = None
) -> list[str]:
    """Every PromQL expression of the dashboard, template variables substituted.

    Built-ins come from DEFAULT_VARIABLES; the dashboard's own query/custom variables become
    `.*` (every value, as "All" would), unless `variables` says otherwise. A variable with no
    value raises ValueError.
    """
    dashboard = json.loads(Path(path).read_text())
    values = dict(DEFAULT_VARIABLES)
    for var in dashboard.get("templating", {}).get("list", []):
        if var.get("type") in ("query", "custom", "textbox", "constant"):
            values[var["name"]] = ".*" if var.get("type") in ("query", "custom") else ""
    values.update(variables or {})

    def substitute(match: re.Match[str]) -> str:
        name = next(g for g in match.groups() if g)
        if name not in values:
            raise ValueError(f"dashboard {path}: variable ${name} has no value to substitute")
        return values[name]

    exprs: list[str] = []
    for panel in _panels(dashboard.get("panels", [])):
        for target in panel.get("targets", []):
            expr = target.get("expr")
            if expr:
                exprs.append(_VARIABLE.sub(substitute, expr))
    return exprs


_NOT_METRICS = frozenset(
    [
        "by",
        "without",
        "on",
        "ignoring",
        "group_left",
        "group_right",
        "and",
        "or",
        "unless",
        "bool",
        "offset",
        "inf",
        "nan",
    ]
)


def metric_names_in(expr: str) -> set[str]:
    """The metric names a PromQL expression selects (functions, keywords, labels excluded)."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # strings
    text = re.sub(r"\{[^}]*\}", "", text)  # label matchers
    text = re.sub(r"\[[^\]]*\]", "", text)  # ranges
    text = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", text)
    names = re.findall(r"(?<![\w.])([a-zA-Z_:][\w:]*)\b(?!\s*\()", text)
    return {name for name in names if name.lower() not in _NOT_METRICS}


@dataclass(frozen=True, slots=True)
class QueryCheck:
    """One dashboard query evaluated: how many series came back, how many finite."""

    expr: str
    num_series: int
    num_finite: int
    error: str | None = None

    @property
    def has_data(self) -> bool:
        return self.error is None and self.num_series > 0

    @property
    def is_ok(self) -> bool:
        """Data, and at least one finite value (NaN is what a ratio of idle counters gives)."""
        return self.has_data and self.num_finite > 0


def evaluate_dashboard(
    prom: PrometheusServer,
    dashboard: Path = DEFAULT_DASHBOARD,
    variables: Mapping[str, str] | None = None,
) -> list[QueryCheck]:
    """Run every dashboard query through Prometheus's HTTP API."""
    checks: list[QueryCheck] = []
    for expr in dashboard_queries(dashboard, variables):
        try:
            result = prom.query(expr)
        except PrometheusError as exc:
            checks.append(QueryCheck(expr, 0, 0, str(exc)))
            continue
        finite = sum(1 for sample in result if math.isfinite(float(sample["value"][1])))
        checks.append(QueryCheck(expr, len(result), finite))
    return checks


def check_dashboard_against(
    targets: Sequence[str],
    dashboard: Path = DEFAULT_DASHBOARD,
    *,
    num_scrapes: int = 2,
    timeout_s: float = 60.0,
) -> list[QueryCheck]:
    """Start Prometheus on `targets`, wait for `num_scrapes` scrapes, evaluate the dashboard.

    Keep the exporters busy meanwhile: rates over idle counters are 0 and their ratios NaN
    (`QueryCheck.has_data` accepts those, `is_ok` does not).
    """
    with run_prometheus(targets) as prom:
        prom.wait_for_scrapes(num_scrapes, timeout_s)
        return evaluate_dashboard(prom, dashboard)
