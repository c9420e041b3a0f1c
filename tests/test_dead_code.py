"""No dead code: every function, method, class and import in kvstore/ and tiers/ is used by the
package or its tests, except the callbacks a framework calls by name (listed here)."""

from __future__ import annotations

from pathlib import Path

import pytest

vulture = pytest.importorskip("vulture")

ROOT = Path(__file__).resolve().parent.parent

# Called by vLLM (the connector API, its stats and metadata), typer and rich, by name.
CALLED_BY_NAME = {
    "_root",  # typer's callback for `kvstore --version`
    "__getattr__",  # a package's lazy names (PEP 562): tiers, kvstore.remote, kvstore.eventbus
    "get_renderables",  # rich
    "requires_kv_delivery",
    "wait_for_layer_load",
    "save_kv_layer",
    "get_external_cache_hit_sources",
    "get_kv_connector_stats",
    "build_kv_connector_stats",
    "build_prom_metrics",
    "has_pending_push_work",
    "request_finished_all_groups",  # SupportsHMA
    "aggregate",
    "reset",
    "reduce",
}
KINDS = ("function", "method", "class", "property", "import")


def test_no_unused_functions_classes_or_imports() -> None:
    finder = vulture.Vulture()
    finder.scavenge([str(ROOT / p) for p in ("kvstore", "tiers", "tests", "reliability")])
    products = (ROOT / "kvstore", ROOT / "tiers")
    dead = [
        f"{item.filename}:{item.first_lineno}: unused {item.typ} {item.name!r}"
        for item in finder.get_unused_code(min_confidence=60)
        if item.typ in KINDS
        and item.name not in CALLED_BY_NAME
        and any(Path(item.filename).is_relative_to(p) for p in products)
    ]
    assert not dead, "\n".join(dead)
