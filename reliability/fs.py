"""Small filesystems for fault tests: a size-limited tmpfs the test mounts and removes itself.

`small_filesystem(size_bytes)` mounts a tmpfs of that size (`mount -t tmpfs -o size=...`) on a
fresh directory and unmounts it afterwards; where mounting is not permitted (not root, no
CAP_SYS_ADMIN, a seccomp profile) it raises `MountUnavailable` with the reason, which tests turn
into a skip and the runner into a row note. A tmpfs fills exactly like a full disk does for
LMDB: `write`/`pwrite` fail with ENOSPC, and a write into a mapped page that has no backing
memory raises SIGBUS.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

__all__ = ["MountUnavailable", "mount_unavailable_reason", "small_filesystem"]

_MOUNT_TIMEOUT_S = 30.0


class MountUnavailable(Exception):
    """This process may not mount a filesystem (the message says why)."""


def _run(*command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        command, capture_output=True, text=True, timeout=_MOUNT_TIMEOUT_S, check=False
    )


@contextmanager
def small_filesystem(size_bytes: int) -> Iterator[Path]:
    """A tmpfs of `size_bytes` mounted on a new directory (unmounted and removed after)."""
    if shutil.which("mount") is None:
        raise MountUnavailable("no `mount` command on this machine")
    if os.geteuid() != 0:
        raise MountUnavailable(f"mounting a tmpfs needs root; running as uid {os.geteuid()}")
    base = Path(tempfile.mkdtemp(prefix="kvstore-smallfs-"))
    done = _run("mount", "-t", "tmpfs", "-o", f"size={size_bytes},mode=0700", "tmpfs", str(base))
    if done.returncode != 0:
        base.rmdir()
        raise MountUnavailable(f"mount -t tmpfs failed: {done.stderr.strip() or done.returncode}")
    try:
        yield base
    finally:
        undone = _run("umount", str(base))
        if undone.returncode != 0:  # something still holds it open: detach lazily
            _run("umount", "-l", str(base))
        shutil.rmtree(base, ignore_errors=True)


def mount_unavailable_reason() -> str:
    """ "" if a small tmpfs can be mounted here, else why not."""
    try:
        with small_filesystem(1 << 20):
            return ""
    except MountUnavailable as exc:
        return str(exc)
