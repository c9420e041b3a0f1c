"""Lowering a process's CPU and I/O priority, as far as Linux lets an unprivileged user.

The disk writer runs at nice 10 and the lowest best-effort I/O level: when the engine wants
every core, the writer gets about a tenth of one (CFS weights 110 vs 1024), enough for its
checksums and copies, and never starves. `SCHED_IDLE` and the idle I/O class were tried and
starve it instead: vLLM's CPU engine keeps an OpenMP team busy on every core it binds, so an
idle-class writer ran only between requests; the rows it had pinned for the write stayed
pinned, and the CPU tier stopped taking new chunks (an engine test saw no CPU eviction at all).
Lowering is always allowed; raising back is not, which is why only a process of its own is
lowered.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import platform

__all__ = ["IOPRIO_CLASS_BE", "lower_priority", "read_ioprio"]

logger = logging.getLogger(__name__)

IOPRIO_CLASS_BE = 2
_IOPRIO_CLASS_SHIFT = 13
_IOPRIO_WHO_PROCESS = 1
# (ioprio_set, ioprio_get) by machine: asm-generic numbering on arm64/riscv.
_IOPRIO_SYSCALLS = {
    "x86_64": (251, 252),
    "aarch64": (30, 31),
    "riscv64": (30, 31),
    "ppc64le": (273, 274),
    "s390x": (282, 283),
}


def _syscall(number: int, *args: int) -> int:
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    result = int(libc.syscall(number, *args))
    if result < 0:
        errno = ctypes.get_errno()
        raise OSError(errno, os.strerror(errno))
    return result


def _ioprio(io_class: int, level: int) -> int:
    return (io_class << _IOPRIO_CLASS_SHIFT) | level


def read_ioprio(pid: int = 0) -> tuple[int, int] | None:
    """`pid`'s I/O priority (class, level); None where this machine's syscall number is not
    known."""
    numbers = _IOPRIO_SYSCALLS.get(platform.machine())
    if numbers is None:
        return None
    value = _syscall(numbers[1], _IOPRIO_WHO_PROCESS, pid)
    return value >> _IOPRIO_CLASS_SHIFT, value & ((1 << _IOPRIO_CLASS_SHIFT) - 1)


def lower_priority(*, nice: int = 10) -> list[str]:
    """Lower this process's CPU priority to `nice` and its I/O to the lowest best-effort level;
    returns the steps that took effect (logged when one fails)."""
    applied: list[str] = []
    try:
        os.setpriority(os.PRIO_PROCESS, 0, nice)
        applied.append(f"nice{nice}")
    except OSError as exc:
        logger.warning("kvstore disk writer: nice %d refused (%s)", nice, exc)
    numbers = _IOPRIO_SYSCALLS.get(platform.machine())
    if numbers is not None:
        try:
            _syscall(numbers[0], _IOPRIO_WHO_PROCESS, 0, _ioprio(IOPRIO_CLASS_BE, 7))
            applied.append("ioprio_be7")
        except OSError as exc:
            logger.warning("kvstore disk writer: lowest best-effort I/O refused (%s)", exc)
    return applied
