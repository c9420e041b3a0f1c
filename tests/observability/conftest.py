from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.prometheus import PrometheusUnavailable, ensure_prometheus


@pytest.fixture(scope="session")
def prometheus_binary() -> Path:
    """The real Prometheus (installed with apt-get when root), or a skip saying why not."""
    try:
        return ensure_prometheus()
    except PrometheusUnavailable as exc:
        pytest.skip(f"no Prometheus: {exc}")
