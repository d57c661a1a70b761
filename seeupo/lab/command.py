"""What ``seeupo lab table1|reach|limits`` do once their flags are parsed: plan a lab table's runs,
measure them with a progress bar, assemble and write the table."""

from __future__ import annotations

import time
from pathlib import Path

from rich.table import Table


def run_table(mod, name: str, quick: bool, seeds, workers, out: Path, bar) -> tuple[dict, str]:
    """One lab table (``mod``: table1, reach or limits) measured and written under ``out``; returns the
    table and the closing line (runs, seconds, files)."""
    jobs = mod.plan(quick=quick, seeds=seeds)
    start = time.perf_counter()
    with bar:
        task = bar.add_task(f"{name} ({len(jobs)} runs)", total=len(jobs))
        results = mod.measure(jobs, workers=workers, progress=lambda: bar.advance(task))
    table = mod.assemble(results)
    paths = mod.write(table, out)
    return table, (f"{len(jobs)} runs in {time.perf_counter() - start:.1f} s; wrote {paths['json']}, {paths['md']}, "
                   f"{paths['png']}")


def table1_rows(rows: list[dict], title: str) -> Table:
    """Table 1's rows as a terminal table."""
    from seeupo.lab.table1 import COLUMNS, cells, sort_key

    t = Table(title=title)
    for _, name, _ in COLUMNS:
        t.add_column(name)
    for r in sorted(rows, key=sort_key):
        t.add_row(*cells(r))
    return t


def run_named(name: str, quick: bool, seeds, workers, out: Path, bar) -> list:
    """``seeupo lab NAME``: the table measured and written; returns what to show (a table or lines,
    then the closing line)."""
    import importlib

    mod = importlib.import_module(f"seeupo.lab.{name}")
    table, done = run_table(mod, name, quick, seeds, workers, out, bar)
    if name == "table1":
        return [table1_rows(table["rows"], "Table 1 (main rows)"), done]
    if name == "reach":
        found = [r for r in table["search"] if r["seeds_with_drop"]]
        return [f"search: {len(table['search'])} rows, {len(found)} with a drop under the exact step", done]
    return [mod.markdown(table), done]
