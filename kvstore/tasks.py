"""`OwnedTasks`: the asyncio tasks of one component, none of them left to die silently.

Every background task kvstore runs (the disk writer, the touch flusher, a promotion, a remote
probe, fetch or write, a Redis removals listener) belongs to an `OwnedTasks`:

- `spawn(coro, name=..., on_death=..., restart=...)` starts it and keeps a reference until it
  ends. A task that raises is logged once, with its name; `on_death(exc)` then runs, which fails
  its pending work and frees what it pinned; `restart()` gives a fresh coroutine to run instead,
  while the owner's restart budget lasts; when the budget is spent `on_give_up()` runs once.
  With `is_failed_if_cancelled`, a cancelled task's `on_death` runs too (with the
  `CancelledError`): work whose requester waits for an answer either way.
- `close(deadline_s)` stops intake (a later `spawn` closes the coroutine and runs its
  `on_death` with `OwnerClosing`, so its work is failed, not lost), cancels what runs and waits
  for it until the deadline (a `time.monotonic()` value); it returns how many tasks were still
  running.

Threading: every call comes from the event loop's thread.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine
from typing import Any

__all__ = ["OwnedTasks", "OwnerClosing"]

logger = logging.getLogger(__name__)

Work = Coroutine[Any, Any, Any]


class OwnerClosing(Exception):
    """Given to `on_death` of work spawned after `close()` began (it never ran)."""


class OwnedTasks:
    """See the module docstring."""

    def __init__(
        self,
        owner: str,
        *,
        max_restarts: int = 0,
        on_give_up: Callable[[], None] | None = None,
    ) -> None:
        self._owner = owner
        self._max_restarts = max_restarts
        self._on_give_up = on_give_up
        self._tasks: set[asyncio.Task[Any]] = set()
        self.num_restarts = 0
        self.is_closing = False

    def __len__(self) -> int:
        return len(self._tasks)

    def spawn(
        self,
        work: Work,
        *,
        name: str,
        on_death: Callable[[BaseException], None] | None = None,
        restart: Callable[[], Work] | None = None,
        is_failed_if_cancelled: bool = False,
    ) -> asyncio.Task[Any] | None:
        """Run `work` as an owned task (None, work closed and failed, once closing)."""
        if self.is_closing:
            work.close()
            if on_death is not None:
                on_death(OwnerClosing(f"{self._owner} is closing"))
            return None
        task = asyncio.get_running_loop().create_task(work, name=f"{self._owner}-{name}")
        self._tasks.add(task)
        task.add_done_callback(
            lambda done: self._ended(done, name, on_death, restart, is_failed_if_cancelled)
        )
        return task

    def _ended(
        self,
        task: asyncio.Task[Any],
        name: str,
        on_death: Callable[[BaseException], None] | None,
        restart: Callable[[], Work] | None,
        is_failed_if_cancelled: bool,
    ) -> None:
        self._tasks.discard(task)
        if task.cancelled():
            if is_failed_if_cancelled and on_death is not None:
                on_death(asyncio.CancelledError(f"{self._owner} {name} was cancelled"))
            return
        exc = task.exception()
        if exc is None:
            return
        logger.error("kvstore %s task %s died: %r", self._owner, name, exc, exc_info=exc)
        if on_death is not None:
            on_death(exc)
        if restart is not None and self._may_restart(name):
            self.spawn(restart(), name=name, on_death=on_death, restart=restart)

    def _may_restart(self, name: str) -> bool:
        if self.is_closing:
            return False
        if self.num_restarts < self._max_restarts:
            self.num_restarts += 1
            logger.warning("kvstore %s: restarting %s (%d of %d)",
                           self._owner, name, self.num_restarts, self._max_restarts)  # fmt: skip
            return True
        if self._on_give_up is not None:
            give_up, self._on_give_up = self._on_give_up, None
            give_up()
        return False

    async def close(self, deadline_s: float) -> int:
        """Stop intake, cancel every task and wait for them until `deadline_s`; the number of
        tasks still running then."""
        self.is_closing = True
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        if not tasks:
            return 0
        _, pending = await asyncio.wait(tasks, timeout=max(0.0, deadline_s - time.monotonic()))
        if pending:
            logger.warning("kvstore %s: %d task(s) still running at the deadline",
                           self._owner, len(pending))  # fmt: skip
        return len(pending)
