"""Progress displays for long work: rich's bar on a terminal, plain lines elsewhere (CI logs, nohup)."""

from __future__ import annotations

import os
import time

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn


class LineProgress:
    """Progress for output that is not a terminal (CI logs, nohup): a plain line when a stage starts,
    at most every ``interval`` seconds while it runs (``$SEEUPO_PROGRESS_SECONDS``, default 30), and
    when it ends. The same calls as rich's ``Progress`` (the subset seeupo uses)."""

    def __init__(self, out: Console, interval: float | None = None):
        self.out = out
        self.interval = float(interval if interval is not None else os.environ.get("SEEUPO_PROGRESS_SECONDS", 30))
        self.tasks: dict[int, dict] = {}
        self._next = 0

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def start(self):
        pass

    def stop(self):
        pass

    def add_task(self, description: str, total: float | None = None, **kw) -> int:
        self._next += 1
        now = time.perf_counter()
        self.tasks[self._next] = {"description": description, "total": total, "completed": 0, "start": now,
                                  "printed": now}
        self._line(self.tasks[self._next], "started")
        return self._next

    def update(self, task: int, *, completed: float | None = None, description: str | None = None, **kw) -> None:
        t = self.tasks.get(task)
        if t is None:
            return
        if description is not None:
            t["description"] = description
        if completed is not None:
            t["completed"] = completed
        now = time.perf_counter()
        if t["total"] is not None and t["completed"] >= t["total"] and not t.get("done"):
            t["done"] = True
            self._line(t, "done")
        elif now - t["printed"] >= self.interval:
            self._line(t)

    def advance(self, task: int, advance: float = 1) -> None:
        t = self.tasks.get(task)
        if t is not None:
            self.update(task, completed=t["completed"] + advance)

    def remove_task(self, task: int) -> None:
        t = self.tasks.pop(task, None)
        if t is not None and not t.get("done"):
            self._line(t, "stopped")

    def _line(self, t: dict, note: str = "") -> None:
        t["printed"] = time.perf_counter()
        total = f"/{t['total']:g}" if t["total"] is not None else ""
        self.out.print(f"[progress] {t['description']}: {t['completed']:g}{total} "
                       f"({t['printed'] - t['start']:.0f} s){' ' + note if note else ''}", markup=False,
                       highlight=False, soft_wrap=True)


def progress_display(console: Console, *, quiet: bool = False):
    """rich's ``Progress`` bar on a terminal; ``LineProgress`` where the output is not one."""
    if not console.is_terminal and not quiet:
        return LineProgress(console)
    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TimeElapsedColumn(), console=console, transient=False, disable=quiet)


def rl_bar(bar, total: int):
    """``Trainer.run``'s ``progress(done, record)``: an "RL" task on ``bar``, added when RL starts (after
    the warm-up and the evaluation before RL), showing the last iteration's reward and success."""
    task = None

    def on_iteration(done: int, record: dict | None) -> None:
        nonlocal task
        if task is None:
            task = bar.add_task("RL", total=total, completed=done)
        if record is not None:
            bar.update(task, completed=done, description=(
                f"RL  reward {record['reward_mean']:.3f}  success {record['success_rate']:.2f}"))
    return on_iteration
