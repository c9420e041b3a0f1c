"""The demo's progress on the terminal: a bar over the requests of the kvstore run, the prompt
tokens each tier has served so far under it, then a bar for the reference run without kvstore.

`run_demo` drives it through its callbacks: `message` for `on_progress`, `turn` for `on_turn`.
On a terminal the bars update in place; in a file or a pipe rich prints their final state once.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING

from rich.console import Console, RenderableType
from rich.markup import escape
from rich.progress import BarColumn, Progress, ProgressColumn, TaskID, TextColumn, TimeElapsedColumn
from rich.text import Text

if TYPE_CHECKING:
    from kvstore.demo.runner import TurnStats

__all__ = ["DemoProgress", "TierTotals"]


@dataclass(slots=True)
class TierTotals:
    """Prompt tokens served so far, by who served them."""

    engine_cache: int = 0
    cpu: int = 0
    disk: int = 0
    computed: int = 0

    def add(self, stats: TurnStats) -> None:
        self.engine_cache += stats.engine_cache_tokens
        self.cpu += stats.cpu_tokens
        self.disk += stats.disk_tokens
        self.computed += stats.computed_tokens

    def describe(self) -> str:
        return (
            f"tokens: engine cache {self.engine_cache:,} · kvstore CPU {self.cpu:,} · "
            f"disk {self.disk:,} · computed {self.computed:,}"
        )


class _Bars(Progress):
    """Rich's progress table with the tier totals as one more line under it."""

    def __init__(self, totals: TierTotals, *columns: ProgressColumn, console: Console) -> None:
        self.totals = totals  # before Progress.__init__, which renders once
        # No refresh thread where nothing is redrawn (a file, a pipe); a gentle one on a terminal.
        # Rich must not take over sys.stdout/sys.stderr on a terminal: they lead to the log.
        super().__init__(
            *columns,
            console=console,
            auto_refresh=console.is_terminal,
            refresh_per_second=4,
            redirect_stdout=False,
            redirect_stderr=False,
        )

    def get_renderables(self) -> Iterable[RenderableType]:
        yield self.make_tasks_table(self.tasks)
        yield Text(self.totals.describe(), style="dim")


class DemoProgress:
    """Progress of a `run_demo` call with `num_requests` requests in `num_turns` turns."""

    def __init__(
        self, console: Console, *, num_requests: int, num_turns: int, has_reference: bool
    ) -> None:
        self.totals = TierTotals()
        self._num_requests, self._num_turns = num_requests, num_turns
        self._has_reference = has_reference
        self._bars = _Bars(
            self.totals,
            TextColumn("{task.description:<16}"),
            BarColumn(bar_width=28),
            TextColumn("{task.fields[count]}"),
            TimeElapsedColumn(),
            console=console,
        )
        self._kvstore = self._bars.add_task(
            "with kvstore", total=num_requests, count=self._count(0, 0)
        )
        self._reference: TaskID | None = None

    def __enter__(self) -> DemoProgress:
        self._bars.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if exc is None and self._reference is not None:
            count = f"{self._num_requests}/{self._num_requests} requests"
            self._bars.update(
                self._reference, total=self._num_requests, completed=self._num_requests,
                count=count,
            )  # fmt: skip
        self._bars.stop()

    def message(self, text: str) -> None:
        """A line above the bars (`run_demo`'s `on_progress`)."""
        self._bars.console.print(f"[dim]·[/dim] {escape(text)}", soft_wrap=True)

    def turn(self, stats: TurnStats) -> None:
        """One turn of the kvstore run is done (`run_demo`'s `on_turn`)."""
        self.totals.add(stats)
        done = int(self._bars.tasks[self._kvstore].completed) + stats.num_requests
        self._bars.update(self._kvstore, completed=done, count=self._count(done, stats.turn + 1))
        if stats.turn + 1 == self._num_turns and self._has_reference:
            self._reference = self._bars.add_task("without kvstore", total=None, count="")

    def _count(self, num_requests_done: int, num_turns_done: int) -> str:
        return (
            f"{num_requests_done}/{self._num_requests} requests, "
            f"turn {num_turns_done}/{self._num_turns}"
        )
