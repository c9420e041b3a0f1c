from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random Llama built locally once per test session."""
    from kvstore.tiny_model import build_tiny_llama

    return build_tiny_llama(tmp_path_factory.mktemp("tiny-llama"))
