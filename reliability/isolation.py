"""Running a piece of fault code where a crash, a signal or a hang cannot take the caller down.

`in_child(fn)` forks, runs `fn` in the child and returns what it returned (it must be
JSON-serialisable), or says how the child died: by a signal (SIGBUS from a truncated map, SIGSEGV
from a damaged page), by an exception, or by running past its time limit (then it is killed).
Forking is cheap (milliseconds) next to starting Python with torch (seconds), so fault tests can
isolate every example. `time_limit` bounds Python code in the current (main) thread.
"""

from __future__ import annotations

import contextlib
import faulthandler
import json
import os
import select
import signal
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

__all__ = ["ChildResult", "Hang", "in_child", "time_limit"]


class Hang(Exception):
    """Code ran past its time limit."""


@contextlib.contextmanager
def time_limit(seconds: float) -> Iterator[None]:
    """Raise `Hang` in the main thread if the body runs longer than `seconds` (Python code
    only: a call blocked inside C returns first)."""

    def expire(signum: int, frame: object) -> None:
        raise Hang(f"ran longer than {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@dataclass(frozen=True, slots=True)
class ChildResult:
    """How a forked child ended: `value` if it returned, else why not (`how`)."""

    how: str  # "returned", "raised", "signal", "timeout", "exit"
    value: Any = None
    detail: str = ""

    @property
    def returned(self) -> bool:
        return self.how == "returned"

    def describe(self) -> str:
        return f"{self.how}: {self.detail}" if self.detail else self.how


def in_child(fn: Callable[[], Any], *, timeout_s: float) -> ChildResult:
    """Run `fn` in a forked child; see the module docstring."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into the caller's stack
        os.close(read_fd)
        faulthandler.disable()  # a signal is the result here, not a report on stderr
        code = 0
        try:
            payload = {"how": "returned", "value": fn()}
        except BaseException as exc:
            lines = traceback.format_exception_only(type(exc), exc)
            payload = {"how": "raised", "detail": "".join(lines).strip()[-2000:]}
            code = 1
        try:
            data = json.dumps(payload).encode()
        except (TypeError, ValueError) as exc:
            data = json.dumps({"how": "raised", "detail": f"unserialisable result: {exc}"}).encode()
        with os.fdopen(write_fd, "wb") as pipe:
            pipe.write(data)
        os._exit(code)
    os.close(write_fd)
    return _collect(pid, read_fd, timeout_s)


def _collect(pid: int, read_fd: int, timeout_s: float) -> ChildResult:
    deadline = time.monotonic() + timeout_s
    chunks: list[bytes] = []
    with os.fdopen(read_fd, "rb", buffering=0) as pipe:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                return ChildResult("timeout", detail=f"killed after {timeout_s} s")
            ready, _, _ = select.select([pipe], [], [], min(left, 0.5))
            if ready:
                chunk = pipe.read(1 << 16)
                if not chunk:
                    break
                chunks.append(chunk)
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        return ChildResult("signal", detail=signal.Signals(os.WTERMSIG(status)).name)
    try:
        payload = json.loads(b"".join(chunks))
    except ValueError:
        return ChildResult("exit", detail=f"status {os.waitstatus_to_exitcode(status)}")
    return ChildResult(payload["how"], payload.get("value"), payload.get("detail", ""))
