"""The ``seeupo`` command line: ``seeupo train``, ``seeupo lab table1``."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="seeupo: multi-turn agent RL for LLMs (SeeUPO and its backbones).")
lab_app = typer.Typer(add_completion=False, no_args_is_help=True,
                      help="The tabular convergence lab (exact expectations, no neural models).")
app.add_typer(lab_app, name="lab")
console = Console(width=None if sys.stdout.isatty() else 160)


def _progress() -> Progress:
    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TimeElapsedColumn(), console=console, transient=False)


@lab_app.command("table1")
def lab_table1(
    out: Path = typer.Option(Path("runs/table1"), "--out", help="Folder for table1.json, table1.md, table1.png."),
    quick: bool = typer.Option(False, "--quick", help="5 seeds x 150 iterations (under a minute on 2 cores)."),
    seeds: Optional[int] = typer.Option(None, "--seeds", min=1, help="Seeds per row (default 5 quick, 20 full)."),
    workers: Optional[int] = typer.Option(None, "--workers", min=1, help="Processes (default: up to 2)."),
) -> None:
    """Measure the paper's Table 1: monotonic improvement and convergence of every algorithm."""
    from seeupo.lab import table1

    jobs = table1.plan(quick=quick, seeds=seeds)
    start = time.perf_counter()
    with _progress() as bar:
        task = bar.add_task(f"table1 ({len(jobs)} runs)", total=len(jobs))
        results = table1.measure(jobs, workers=workers, progress=lambda: bar.advance(task))
    table = table1.assemble(results)
    paths = table1.write(table, out)
    _print_rows(table["rows"], "Table 1 (main rows)")
    console.print(f"[bold]{len(jobs)} runs in {time.perf_counter() - start:.1f} s[/]; "
                  f"wrote {paths['json']}, {paths['md']}, {paths['png']}")


def _print_rows(rows: list[dict], title: str) -> None:
    from seeupo.lab.table1 import ALGOS, COLUMNS

    t = Table(title=title)
    for _, name, _ in COLUMNS:
        t.add_column(name)
    for r in sorted(rows, key=lambda r: (r["setting"], r["policy"], r["mode"], ALGOS.index(r["algorithm"]))):
        t.add_row(*[fmt.format(r[k]) for k, _, fmt in COLUMNS])
    console.print(t)


@app.command()
def train(
    out: Path = typer.Option(Path("runs/train"), "--out", help="Run folder."),
) -> None:
    """Train. Until the LLM trainer lands, this runs the convergence lab's quick Table 1."""
    console.print("[yellow]The LLM trainer is not built yet; `seeupo train` runs "
                  "`seeupo lab table1 --quick` meanwhile.[/]")
    lab_table1(out=out, quick=True, seeds=None, workers=None)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
