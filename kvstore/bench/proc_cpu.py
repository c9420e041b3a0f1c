"""CPU seconds of a process tree, split between the engine's processes and kvstore's disk writer.

Read from `/proc` (Linux): user + system time of `root` and every live descendant. A process
that exited since the last reading takes its seconds with it, so a benchmark reads before and
after each measurement, with its engines up.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

__all__ = ["TreeCPU", "tree_cpu"]

_TICKS_PER_S = os.sysconf("SC_CLK_TCK")
_WRITER_MARK = b"kvstore.diskwriter.child"


@dataclass(frozen=True, slots=True)
class TreeCPU:
    engine_s: float  # the engine's processes (with kvstore's threads in them)
    writer_s: float  # kvstore's disk-writer processes

    def __sub__(self, other: TreeCPU) -> TreeCPU:
        return TreeCPU(self.engine_s - other.engine_s, self.writer_s - other.writer_s)


def _stat(pid: str) -> tuple[int, float] | None:
    """(parent pid, CPU seconds) of `pid`, None if it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return int(fields[1]), (int(fields[11]) + int(fields[12])) / _TICKS_PER_S


def _is_writer(pid: int) -> bool:
    try:
        return _WRITER_MARK in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def tree_cpu(root: int) -> TreeCPU:
    """CPU seconds so far of `root` and its live descendants."""
    stats = {int(pid): stat for pid in os.listdir("/proc") if pid.isdigit() if (stat := _stat(pid))}
    children: dict[int, list[int]] = {}
    for pid, (parent, _) in stats.items():
        children.setdefault(parent, []).append(pid)
    engine_s = writer_s = 0.0
    todo = [root] if root in stats else []
    while todo:
        pid = todo.pop()
        if _is_writer(pid):
            writer_s += stats[pid][1]
        else:
            engine_s += stats[pid][1]
        todo += children.get(pid, [])
    return TreeCPU(engine_s, writer_s)
