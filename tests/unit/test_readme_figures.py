"""The README's test-suite and mutation figures, and docs/core.md's HGPO hand case and refactor run
count, are what their records and the code give."""

import json
import os
import re
from pathlib import Path

import torch

from seeupo.core.advantages import hgpo

ROOT = Path(__file__).resolve().parents[2]


def _min_s(seconds: float) -> str:
    s = round(seconds)
    return f"{s // 60} min {s % 60} s"


def test_the_ci_figure_is_its_log():
    log = (ROOT / "results" / "ci" / "ci-177845a.log").read_text()
    passed, skipped, secs = re.search(r"(\d+) passed, (\d+) skipped, .* in ([\d.]+)s", log).groups()
    wall = int(re.search(r"CI rc=0 wall=(\d+) s", log).group(1))
    readme = " ".join((ROOT / "README.md").read_text().split())
    assert f"{passed} passed, {skipped} skipped in {_min_s(float(secs))} of tests, {_min_s(wall)} with the set-up" in readme


def test_the_mutation_figure_is_its_logs():
    lasts = [(ROOT / "results" / "mutation" / f).read_text().strip().splitlines()[-1] for f in ("mc45.log", "mc46.log")]
    counts = [re.match(r"CAUGHT (\d+) / MISSED 0 / STALE 0 / ERROR 0 / BROKEN 0 of (\d+) mutations", x).groups() for x in lasts]
    assert all(c == n for c, n in counts)
    readme = " ".join((ROOT / "README.md").read_text().split())
    total = sum(int(c) for c, _ in counts)
    assert f"printed CAUGHT {counts[0][0]} and CAUGHT {counts[1][0]}: all {total} CAUGHT" in readme
    ns = {"__name__": "mutations", "__file__": str(ROOT / "scripts" / "mutation_check.py")}
    cwd = os.getcwd()
    try:  # (the script moves to the project root as it loads)
        exec(compile((ROOT / "scripts" / "mutation_check.py").read_text(), "mutation_check.py", "exec"), ns)
    finally:
        os.chdir(cwd)
    assert f"on purpose ({len(ns['M'])} mutations)" in readme


def test_the_hgpo_hand_case_in_the_docs_is_the_function():
    a = hgpo(torch.tensor([0, 0, 0]), torch.tensor([[0., 0., 10.], [0., 0., 0.], [0., 0., 0.]]),
             torch.tensor([[0, 1, 2], [0, 2, 1], [0, 1, 2]]), torch.ones(3, 3), history=1, gamma=1.0)
    text = (ROOT / "docs" / "core.md").read_text()
    rows = [r for r in text.splitlines() if re.match(r"  \| [012] \| ", r)]
    assert len(rows) == 3
    for t, row in enumerate(rows):
        cells = [c.strip() for c in row.strip().strip("|").split("|")]
        for e in range(3):  # the value each cell ends with (a cell may show the arithmetic first)
            assert cells[1 + e].split("= ")[-1] == f"{float(a[e, t]):.3f}", (t, e)


def test_the_refactor_run_count_in_the_docs_is_the_record():
    runs = json.loads((ROOT / "results" / "same_numbers" / "before.json").read_text())["runs"]
    assert f"({len(runs)} runs:" in (ROOT / "docs" / "core.md").read_text()
