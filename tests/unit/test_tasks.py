"""OwnedTasks: a task that dies is news, restarts have a budget, close has a deadline."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Coroutine
from typing import Any

import pytest

from kvstore.tasks import OwnedTasks, OwnerClosing


async def _fail() -> None:
    await asyncio.sleep(0)
    raise RuntimeError("boom")


async def _forever() -> None:
    await asyncio.Event().wait()


async def _settle() -> None:
    for _ in range(10):
        await asyncio.sleep(0)


async def test_a_dying_task_is_logged_and_its_work_failed(caplog: pytest.LogCaptureFixture) -> None:
    deaths: list[BaseException] = []
    tasks = OwnedTasks("disk")
    tasks.spawn(_fail(), name="writer", on_death=deaths.append)
    await _settle()
    assert [str(exc) for exc in deaths] == ["boom"]
    assert len(tasks) == 0
    assert "kvstore disk task writer died" in caplog.text


async def test_restarts_are_budgeted_and_giving_up_happens_once() -> None:
    starts: list[int] = []
    gave_up: list[bool] = []

    def again() -> Coroutine[Any, Any, None]:
        starts.append(1)
        return _fail()

    tasks = OwnedTasks("disk", max_restarts=2, on_give_up=lambda: gave_up.append(True))
    tasks.spawn(_fail(), name="writer", restart=again)
    await _settle()
    assert len(starts) == 2 and tasks.num_restarts == 2
    assert gave_up == [True]
    tasks.spawn(_fail(), name="toucher", restart=again)
    await _settle()
    assert gave_up == [True] and len(starts) == 2  # the budget is the owner's, spent once


async def test_close_cancels_and_fails_what_asked_for_it() -> None:
    quiet: list[BaseException] = []
    waited: list[BaseException] = []
    tasks = OwnedTasks("remote")
    tasks.spawn(_forever(), name="probe", on_death=quiet.append)
    tasks.spawn(_forever(), name="fetch", on_death=waited.append, is_failed_if_cancelled=True)
    await _settle()
    assert await tasks.close(time.monotonic() + 1.0) == 0
    assert quiet == [] and [type(exc) for exc in waited] == [asyncio.CancelledError]


async def test_work_spawned_while_closing_is_failed_not_run() -> None:
    failed: list[BaseException] = []
    tasks = OwnedTasks("remote")
    await tasks.close(time.monotonic())
    ran = []

    async def work() -> None:
        ran.append(1)

    assert tasks.spawn(work(), name="write", on_death=failed.append) is None
    await _settle()
    assert ran == [] and [type(exc) for exc in failed] == [OwnerClosing]


async def test_close_says_how_many_tasks_outlived_the_deadline() -> None:
    release = asyncio.Event()

    async def stubborn() -> None:
        while not release.is_set():
            try:
                await asyncio.sleep(10)
            except asyncio.CancelledError:
                continue

    tasks = OwnedTasks("disk")
    task = tasks.spawn(stubborn(), name="stubborn")
    await _settle()
    assert await tasks.close(time.monotonic() + 0.05) == 1
    release.set()
    assert task is not None
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
