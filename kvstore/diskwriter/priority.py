"""Lowering a process's CPU and I/O priority to idle, as far as Linux lets an unprivileged user.

Three steps, each best effort: `SCHED_IDLE` (run only on a core nothing else wants), nice 19 (for
kernels or containers that refuse `SCHED_IDLE`), and the idle I/O class (`ioprio_set`, which
the CFQ/BFQ schedulers honour; others ignore it). Lowering is always allowed; raising back is
not, which is why only a process of its own is lowered.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import platform

__all__ = ["IOPRIO_CLASS_IDLE", "lower_priority", "read_ioprio"]

logger = logging.getLogger(__name__)

IOPRIO_CLASS_IDLE = 3
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


def read_ioprio(pid: int = 0) -> int | None:
    """`pid`'s I/O priority class (None where this machine's syscall number is not known)."""
    numbers = _IOPRIO_SYSCALLS.get(platform.machine())
    if numbers is None:
        return None
    return _syscall(numbers[1], _IOPRIO_WHO_PROCESS, pid) >> _IOPRIO_CLASS_SHIFT


def lower_priority() -> list[str]:
    """Lower this process to idle; returns the steps that took effect (logged when one fails)."""
    applied: list[str] = []
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
        applied.append("sched_idle")
    except (AttributeError, OSError) as exc:
        logger.warning("kvstore disk writer: SCHED_IDLE refused (%s); using nice only", exc)
    try:
        os.setpriority(os.PRIO_PROCESS, 0, 19)
        applied.append("nice19")
    except OSError as exc:
        logger.warning("kvstore disk writer: nice 19 refused (%s)", exc)
    numbers = _IOPRIO_SYSCALLS.get(platform.machine())
    if numbers is not None:
        try:
            _syscall(numbers[0], _IOPRIO_WHO_PROCESS, 0, IOPRIO_CLASS_IDLE << _IOPRIO_CLASS_SHIFT)
            applied.append("ioprio_idle")
        except OSError as exc:
            logger.warning("kvstore disk writer: idle I/O class refused (%s)", exc)
    return applied
