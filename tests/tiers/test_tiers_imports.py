"""`tiers/` is synchronous storage code: it never imports kvstore, asyncio or vLLM."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import pkgutil
from pathlib import Path
from types import ModuleType

FORBIDDEN = {"kvstore", "asyncio", "vllm"}
TIERS_DIR = Path(__file__).resolve().parents[2] / "tiers"


def _load_package_init() -> ModuleType:
    """`tiers/__init__.py` itself. Under pytest's prepend import mode `tests/` is on sys.path, so
    a bare `import tiers` may resolve to the namespace package `tests/tiers` instead."""
    spec = importlib.util.spec_from_file_location("_tiers_public_api", TIERS_DIR / "__init__.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _imported_roots(tree: ast.AST) -> set[str]:
    roots: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            roots.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            roots.add(node.module.split(".")[0])
        elif (
            isinstance(node, ast.Call)
            and getattr(node.func, "attr", "") == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
        ):
            roots.add(str(node.args[0].value).split(".")[0])
    return roots


def test_tiers_imports_neither_kvstore_asyncio_nor_vllm() -> None:
    modules = sorted(TIERS_DIR.rglob("*.py"))
    assert len(modules) >= 8
    offenders = {
        str(path.relative_to(TIERS_DIR)): sorted(
            _imported_roots(ast.parse(path.read_text())) & FORBIDDEN
        )
        for path in modules
    }
    assert {name: bad for name, bad in offenders.items() if bad} == {}


def test_public_api_is_exactly_all() -> None:
    package = _load_package_init()
    public = package.__all__
    assert len(set(public)) == len(public)
    for name in public:
        assert getattr(package, name) is not None, name
    exported = {name for name in vars(package) if not name.startswith("_")}
    assert exported - set(public) <= {"annotations"}
    for info in pkgutil.iter_modules([str(TIERS_DIR)]):
        module = importlib.import_module(f"tiers.{info.name}")
        for name in getattr(module, "__all__", []):
            assert hasattr(module, name), f"tiers.{info.name}.__all__ lists missing {name}"
