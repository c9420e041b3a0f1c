"""The curated public surface of `kvstore.remote`; it imports no vLLM and pickles nothing."""

from __future__ import annotations

import ast
from pathlib import Path

import kvstore.remote

PACKAGE = Path(kvstore.remote.__file__).parent


def test_exports_resolve_and_are_public() -> None:
    for name in kvstore.remote.__all__:
        assert getattr(kvstore.remote, name) is not None
    assert all(not name.startswith("_") for name in kvstore.remote.__all__)
    for name in ("RemoteStore", "RemoteChunks", "RemoteConfig", "RemovalWatcher", "BreakerState"):
        assert name in kvstore.remote.__all__


def test_every_error_is_a_kvstore_error() -> None:
    from kvstore.errors import KVStoreError

    errors = [getattr(kvstore.remote, n) for n in kvstore.remote.__all__ if n.endswith("Error")]
    assert len(errors) == 8
    assert all(issubclass(error, KVStoreError) for error in errors)


def test_no_vllm_no_pickle() -> None:
    for path in PACKAGE.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            for name in names:
                assert name.split(".")[0] not in ("vllm", "pickle"), f"{path.name} imports {name}"
