"""Layering rules: only `kvstore/vllm/` imports vLLM; `tiers/` knows nothing of kvstore."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _imports(path: Path) -> Iterator[tuple[int, str]]:
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.lineno, node.module


def _offenders(package: str, banned: tuple[str, ...], allowed_dir: str | None = None) -> list[str]:
    bad = []
    for path in sorted((ROOT / package).rglob("*.py")):
        if allowed_dir is not None and allowed_dir in path.relative_to(ROOT).parts[:2]:
            continue
        for lineno, module in _imports(path):
            if module.split(".")[0] in banned:
                bad.append(f"{path.relative_to(ROOT)}:{lineno} imports {module}")
    return bad


def test_only_kvstore_vllm_imports_vllm() -> None:
    assert _offenders("kvstore", ("vllm",), allowed_dir="vllm") == []


def test_tiers_imports_neither_kvstore_nor_asyncio_nor_vllm() -> None:
    assert _offenders("tiers", ("kvstore", "asyncio", "vllm")) == []


def test_rule_checker_sees_function_level_imports(tmp_path: Path) -> None:
    sample = tmp_path / "m.py"
    sample.write_text("def f():\n    from vllm import LLM\n    return LLM\n")
    assert list(_imports(sample)) == [(2, "vllm")]


_INDEX_MAY_IMPORT = ("kvstore.index", "kvstore.policies", "kvstore.keys", "kvstore.events",
                     "kvstore.errors", "kvstore.occupancy")  # fmt: skip
"""The index and its policies are pure bookkeeping: no I/O, no metrics, no asyncio."""


def _kvstore_imports(package: str) -> Iterator[tuple[str, str]]:
    for path in sorted((ROOT / package).rglob("*.py")):
        for lineno, module in _imports(path):
            yield f"{path.relative_to(ROOT)}:{lineno}", module


def test_the_index_imports_only_bookkeeping() -> None:
    bad = [
        f"{where} imports {module}"
        for package in ("kvstore/index", "kvstore/policies")
        for where, module in _kvstore_imports(package)
        if module.startswith(("kvstore", "tiers", "asyncio", "vllm", "torch"))
        and not module.startswith(_INDEX_MAY_IMPORT)
    ]
    assert bad == []


def test_the_remote_tier_does_not_reach_up_into_the_pipeline() -> None:
    above = ("kvstore.service", "kvstore.pipeline", "kvstore.vllm", "kvstore.metrics",
             "kvstore.index", "kvstore.cli")  # fmt: skip
    bad = [
        f"{where} imports {module}"
        for where, module in _kvstore_imports("kvstore/remote")
        if module.startswith(above)
    ]
    assert bad == []
