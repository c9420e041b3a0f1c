"""Installing a Debian package for the tests that need a real server (Prometheus, Redis)."""

from __future__ import annotations

import os
import shutil
import subprocess

__all__ = ["apt_install"]


def apt_install(package: str, env_var: str) -> str:
    """Install `package` with apt-get, updating the package lists once if the first try fails.
    Returns "" when apt-get succeeded, else why not (not root, no apt-get: naming `env_var`,
    the variable that points at a binary instead; or apt-get's own error)."""
    apt = shutil.which("apt-get")
    if apt is None or os.geteuid() != 0:
        return (
            f"{package} is not on PATH and cannot be installed here (needs root and apt-get): "
            f"install it (`apt-get install {package}`) or set {env_var}"
        )
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    command = [apt, "install", "-y", "--no-install-recommends", package]
    done = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    if done.returncode != 0:  # stale package lists: update once and retry
        subprocess.run([apt, "update"], capture_output=True, env=env, check=False)
        done = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    if done.returncode != 0:
        return f"`apt-get install {package}` failed ({done.returncode}): {done.stderr[-500:]}"
    return ""
