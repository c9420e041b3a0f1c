"""The Grafana dashboard only queries metrics the code defines, and is well-formed."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from kvstore.metrics import METRIC_NAMES
from tests.support.prometheus import DEFAULT_DASHBOARD, dashboard_queries, metric_names_in

SUFFIXES = ("_bucket", "_count", "_sum", "_created")
GRAFANA = DEFAULT_DASHBOARD.parents[1]


def defined(name: str) -> bool:
    if name in METRIC_NAMES:
        return True
    return any(name.endswith(s) and name.removesuffix(s) in METRIC_NAMES for s in SUFFIXES)


def test_every_query_uses_only_defined_metric_names() -> None:
    queries = dashboard_queries()
    assert len(queries) >= 20
    used: set[str] = set()
    for expr in queries:
        names = metric_names_in(expr)
        assert names, f"no metric in {expr!r}"
        undefined = sorted(n for n in names if not defined(n))
        assert not undefined, f"{expr!r} uses undefined metrics {undefined}"
        used |= names
    base = {re.sub(r"_(bucket|count|sum)$", "", n) for n in used}
    assert set(METRIC_NAMES) - base <= {"kvstore_config_info"}, "metrics no panel shows"


def test_metric_names_in_ignores_functions_labels_and_keywords() -> None:
    expr = (
        "histogram_quantile(0.99, sum by (direction, le) "
        '(rate(kvstore_transfer_duration_seconds_bucket{instance=~"a|b"}[5m])))'
        " / ignoring(tier) group_left sum(kvstore_x offset 5m) and on() vector(1)"
    )
    assert metric_names_in(expr) == {"kvstore_transfer_duration_seconds_bucket", "kvstore_x"}


def test_the_dashboard_is_importable() -> None:
    dashboard = json.loads(DEFAULT_DASHBOARD.read_text())
    assert dashboard["uid"] == "kvstore"
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["DS_PROMETHEUS"]["type"] == "datasource"
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dashboard["panels"]:
        if panel["type"] == "row":
            continue
        assert panel["datasource"]["uid"] == "${DS_PROMETHEUS}", panel["title"]
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == "${DS_PROMETHEUS}"
    titles = " ".join(p["title"].lower() for p in dashboard["panels"])
    for needed in ("hit ratio per tier", "hit tokens", "throughput", "p50 / p99", "occupancy",
                   "evictions", "events/s per medium", "drops", "errors"):  # fmt: skip
        assert needed in titles


def test_unknown_template_variables_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "d.json"
    panel = {"type": "timeseries", "targets": [{"expr": "rate(kvstore_lookups_total[$window])"}]}
    path.write_text(json.dumps({"panels": [panel]}))
    with pytest.raises(ValueError, match=r"\$window"):
        dashboard_queries(path)
    assert dashboard_queries(path, {"window": "1m"}) == ["rate(kvstore_lookups_total[1m])"]


@pytest.mark.parametrize(
    "path",
    sorted(p.relative_to(GRAFANA) for p in GRAFANA.rglob("*.yml")),
    ids=str,
)
def test_provisioning_and_prometheus_files_are_present(path: Path) -> None:
    text = (GRAFANA / path).read_text()
    assert text.strip()
    if path.parts[0] == "provisioning":
        assert "apiVersion: 1" in text
