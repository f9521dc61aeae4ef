"""Progress on the terminal (rich): a bar per run over rounds, and bars over many runs.

Presentation only: the engine reports through simulator callbacks (:class:`RoundBar`) and the
studies through a listener of their jobs (:class:`RunBars` for compare, :class:`JobBars` for
sweep and reproduce); neither knows it is drawn.
"""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from fedshift.reporting.tables import round_info


def progress_bars(console: Console) -> Progress:
    """Bars with a description, progress, count, elapsed time and an info field."""
    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.fields[info]}"),
        console=console,
    )


class RoundBar:
    """Simulator callback: a progress bar over a run's rounds with the latest metrics."""

    def __init__(self, label: str, console: Console) -> None:
        self.label = label
        self.progress = progress_bars(console)

    def on_start(self, sim, state) -> None:
        plan = getattr(sim, "memory_plan", None)
        if plan is not None:  # before the bar: what the run will hold, and where
            self.progress.console.print(
                f"{self.label}: {plan.line()}", highlight=False, markup=False
            )
        self.progress.start()
        self.task = self.progress.add_task(
            self.label, total=sim.cfg.rounds, completed=state.round, info=""
        )

    def on_round_end(self, sim, state, metrics) -> None:
        info = round_info(metrics)
        self.progress.update(self.task, completed=state.round, **({"info": info} if info else {}))

    def on_end(self, sim, state) -> None:
        self.progress.stop()

    def on_diverged(self, sim, state, err) -> None:
        self.progress.stop()


class RunBars:
    """Listener of runs drawn as :class:`RoundBar` draws one run: the run's memory plan, then a
    bar over its rounds; runs that overlap (local processes, Ray tasks) share one display, which
    stops (and stays on the screen) once none of them is running."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.progress: Progress | None = None
        self.tasks: dict[str, Any] = {}  # the runs that are going

    def noted(self, key: str, text: str) -> None:
        self.console.print(f"{key}: {text}", highlight=False, markup=False)

    def started(self, key: str, total: int, done: int) -> None:
        if self.progress is None:
            self.progress = progress_bars(self.console)
            self.progress.start()
        self.tasks[key] = self.progress.add_task(key, total=total, completed=done, info="")

    def advanced(self, key: str, done: int, info: str) -> None:
        if self.progress is not None and key in self.tasks:
            self.progress.update(
                self.tasks[key], completed=done, **({"info": info} if info else {})
            )

    def finished(self, key: str, status: str) -> None:
        self.tasks.pop(key, None)
        if not self.tasks and self.progress is not None:
            self.progress.stop()
            self.progress = None


class JobBars:
    """Listener of a reproduction: one bar over all runs, one per run while it trains."""

    def __init__(self, total: int, console: Console) -> None:
        self.progress = progress_bars(console)
        self.all = self.progress.add_task("runs", total=total, info="")
        self.tasks: dict[str, Any] = {}

    def started(self, key: str, total: int, done: int) -> None:
        self.tasks[key] = self.progress.add_task(key, total=total, completed=done, info="")

    def noted(self, key: str, text: str) -> None:
        self.progress.console.print(f"{key}: {text}", highlight=False, markup=False)

    def advanced(self, key: str, done: int, info: str) -> None:
        if key in self.tasks:
            self.progress.update(
                self.tasks[key], completed=done, **({"info": info} if info else {})
            )

    def finished(self, key: str, status: str) -> None:
        task = self.tasks.pop(key, None)
        if task is not None:
            self.progress.remove_task(task)
        self.progress.advance(self.all)
        self.progress.console.print(f"{key}: {status}")
